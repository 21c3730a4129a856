"""The view's JSON API over real loopback sockets, on real runs, and its refusals.

Each test starts ``trollout view`` in its own process (`serve_view`) over a run collected from
the fake deployment (`collected`: landed, failed, retried, hostile and long rows) and asks it
with httpx. Tailing is checked on real files a test appends to.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from click.testing import CliRunner
from view_kit import HOSTILE_CLASS, HOSTILE_PROMPT, LONG_PROMPT, ViewProcess

from trollout.cli.main import cli
from trollout.metrics.run_info import settings_changed
from trollout.recovery.layout import RunLayout
from trollout.view.index import RunIndex, Tail
from trollout.view.runs import Run

Serve = Callable[..., ViewProcess]


def get(view: ViewProcess, route: str, **params: Any) -> Any:
    response = httpx.get(view.url.rstrip("/") + route, params=params, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def test_api_summary_counts_landed_failed_and_retried(collected: Path, serve: Serve) -> None:
    """The run page's summary: counts from the files, the manifest's metadata, the metrics."""
    s = get(serve(collected), "/api/run/0")
    c = s["counts"]
    assert (c["rollouts"], c["landed"], c["failed"], c["pending"]) == (8, 6, 2, 0)
    assert c["retried"] == 1  # task 5: failed once, landed on resume
    assert c["failure_classes"] == {"boom_class": 1, HOSTILE_CLASS: 1}
    m = s["manifest"]
    assert m["input"].endswith("in.jsonl")
    assert len(m["input_sha256"]) == 64
    assert m["deployment"]["agents"] == ["math_agent"]
    assert m["settings_changed"]["agent_name"] == "math_agent"
    assert s["live"] is False
    assert s["metrics"][0]["agent"] == "math_agent"
    assert "pass@1" in s["metrics"][0]["failures_excluded"]


def test_api_filters_sorts_and_bounds_pages(collected: Path, serve: Serve) -> None:
    """Filter to failures, sort by attempts, search text; a page is never more than 500."""
    view = serve(collected)
    failed = get(view, "/api/run/0/rollouts", outcome="failed")
    assert [r["task"] for r in failed["rows"]] == [4, 6]
    assert failed["matched"] == 2
    by_attempts = get(view, "/api/run/0/rollouts", sort="attempts", desc="1", limit="1")
    assert by_attempts["rows"][0]["task"] == 5
    assert by_attempts["rows"][0]["attempts"] == 2
    found = get(view, "/api/run/0/rollouts", q="REVERSE the STRING")
    assert [r["task"] for r in found["rows"]] == [1]
    answer = get(view, "/api/run/0/rollouts", q="olleh")  # in the answer, not the prompt
    assert [r["task"] for r in answer["rows"]] == [1]
    assert get(view, "/api/run/0/rollouts", rmin="2")["matched"] == 0
    big = get(view, "/api/run/0/rollouts", limit="100000")
    assert len(big["rows"]) == 8
    bad = httpx.get(view.url + "api/run/0/rollouts", params={"sort": "__class__"}, timeout=30)
    assert bad.status_code == 400
    assert "sort must be one of" in bad.json()["error"]


def test_api_rollout_page_reads_every_attempt_and_cuts_long_fields(
    collected: Path, serve: Serve
) -> None:
    """A retried rollout shows its failed attempt and its landing; a long prompt is cut and
    the rest comes by slices ("show more")."""
    view = serve(collected)
    r = get(view, "/api/run/0/rollout/0/5/0")
    assert r["summary"]["attempts"] == 2
    assert r["summary"]["outcome"] == "landed"
    assert r["attempts"][0]["_ng_failure_class"] == "agent_run_error"
    assert r["attempts"][0]["_ng_failure_http_status"] == 500
    assert r["landed"]["response"]["output"][0]["content"][0]["text"] == "42"
    long = get(view, "/api/run/0/rollout/0/7/0")
    content = long["input"]["responses_create_params"]["input"][0]["content"]
    assert content["__trollout_cut__"] == "text"
    assert content["length"] == len(LONG_PROMPT)
    rest = get(
        view,
        "/api/run/0/rollout/0/7/0/field",
        src="input",
        path=json.dumps(content["path"]),
        start=str(len(content["text"])),
    )
    assert content["text"] + rest["text"] == LONG_PROMPT
    raw = get(view, "/api/run/0/rollout/0/4/0/raw", src="failure:0")
    assert json.loads(raw["text"])["_ng_failure_class"] == "boom_class"


def test_api_serves_hostile_text_as_data(collected: Path, serve: Serve) -> None:
    """Markup and control characters come back as the JSON strings they are; the page's
    headers forbid any script but its own."""
    view = serve(collected)
    r = get(view, "/api/run/0/rollout/0/6/0")
    assert r["input"]["responses_create_params"]["input"][0]["content"] == HOSTILE_PROMPT
    page = httpx.get(view.url + "run/0/rollout/0/6/0", timeout=30)
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy
    assert "unsafe-inline" not in policy
    assert page.headers["x-content-type-options"] == "nosniff"


def test_api_refuses_other_hosts_methods_and_paths(collected: Path, serve: Serve) -> None:
    """A request for another Host (a rebound name), a write, a path outside the API, a run or
    rollout that does not exist: each is refused, and nothing of the machine is served."""
    view = serve(collected)
    rebound = httpx.get(view.url + "api/runs", headers={"host": f"evil.test:{view.port}"})
    assert rebound.status_code == 403
    assert httpx.post(view.url + "api/runs", content=b"{}").status_code == 405
    for path in (
        "static/../../../../etc/passwd",
        "static/%2e%2e/%2e%2e/etc/passwd",
        "api/run/0/rollout/0/..%2f..%2f/x",
        "api/run/7",
        "api/run/0/rollout/0/99/0",
        "api/run/x",
    ):
        response = httpx.get(view.url + path, timeout=30)
        assert response.status_code in (400, 404), path
        assert "root:" not in response.text


def test_view_refuses_a_run_file_that_is_a_link(
    collected: Path, serve: Serve, tmp_path: Path
) -> None:
    """A run file that is a symbolic link (to a file outside the folder) is not read; the
    page says why."""
    outside = tmp_path / "secret.jsonl"
    outside.write_text('{"_ng_task_index": 0, "_ng_rollout_index": 0, "secret": "s3cret"}\n')
    folder = tmp_path / "run"
    folder.mkdir()
    shutil.copy(collected.with_name("r_manifest.json"), folder / "r_manifest.json")
    (folder / "r.jsonl").symlink_to(outside)
    view = serve(folder / "r.jsonl")
    s = get(view, "/api/run/0")
    assert any("symbolic link" in p for p in s["problems"])
    assert s["counts"]["rollouts"] == 0
    assert "s3cret" not in json.dumps(get(view, "/api/run/0/rollouts", q="s3cret"))


def test_view_follows_a_run_as_lines_are_appended(
    collected: Path, serve: Serve, tmp_path: Path
) -> None:
    """A run still being written: only complete lines count, new ones appear on the next
    request, and the view writes nothing to the folder."""
    folder = tmp_path / "live"
    folder.mkdir()
    lines = collected.read_bytes().splitlines(keepends=True)
    out = folder / "r.jsonl"
    out.write_bytes(lines[0] + lines[1][:20])  # the second line is being written
    before = sorted(os.listdir(folder))
    view = serve(out)
    assert get(view, "/api/run/0")["counts"]["landed"] == 1
    with open(out, "ab") as f:
        f.write(lines[1][20:] + b"".join(lines[2:]))
    summary = get(view, "/api/run/0")
    assert summary["counts"]["landed"] == len(lines)
    assert summary["live"] is True
    assert sorted(os.listdir(folder)) == before


def test_tail_reads_complete_lines_and_restarts_on_a_replaced_file(tmp_path: Path) -> None:
    """`Tail` yields each complete line once, never a torn one, and notices a new file."""
    path = tmp_path / "r.jsonl"
    path.write_bytes(b'{"a": 1}\n{"b"')
    seen: list[tuple[int, bytes]] = []
    tail = Tail(path)
    assert tail.read(lambda o, line: seen.append((o, line))) is True
    assert seen == [(0, b'{"a": 1}\n')]
    with open(path, "ab") as f:
        f.write(b": 2}\n")
    tail.read(lambda o, line: seen.append((o, line)))
    assert seen[1] == (9, b'{"b": 2}\n')
    assert tail.read(lambda o, line: seen.append((o, line))) is False


def test_index_starts_afresh_when_the_rollouts_file_is_replaced(tmp_path: Path) -> None:
    """A run overwritten in place (a new file, or a shorter one) is indexed anew, not mixed."""
    out = tmp_path / "r.jsonl"
    row = '{{"_ng_task_index": {}, "_ng_rollout_index": 0, "reward": {}}}\n'
    out.write_text(row.format(0, 1.0) + row.format(1, 0.0))
    index = RunIndex(0, Run("r", (RunLayout.for_output(out),)))
    index.refresh()
    assert (len(index), list(index.reward)) == (2, [1.0, 0.0])
    out.unlink()
    out.write_text(row.format(7, 0.5))
    index.refresh()
    assert (len(index), list(index.task), list(index.reward)) == (1, [7], [0.5])


def test_compare_puts_differing_tasks_first(
    collected: Path, collected_b: Path, serve: Serve
) -> None:
    """Two runs of the same tasks: the task whose outcome differs comes first, linked to both."""
    c = get(serve(collected, collected_b), "/api/compare/0/1")
    first = c["rows"][0]
    assert first["task"] == 0
    assert first["differs"] is True
    assert first["a"]["outcomes"] == {"landed": 1}
    assert first["b"]["outcomes"] == {"failed": 1}
    assert first["a"]["rollouts"][0]["id"] == "0/0/0"
    assert c["differing"] >= 1
    assert not c["rows"][-1]["differs"]


def test_view_cli_refuses_what_is_not_a_run(tmp_path: Path) -> None:
    """A RUN that does not exist, or a glob matching nothing, exits 2 naming it."""
    result = CliRunner().invoke(cli, ["view", str(tmp_path / "nope.jsonl"), "--no-browser"])
    assert result.exit_code == 2
    assert "does not exist" in result.stderr
    result = CliRunner().invoke(cli, ["view", str(tmp_path / "*.jsonl"), "--no-browser"])
    assert result.exit_code == 2
    assert "matches no rollouts file" in result.stderr


def test_view_warns_when_serving_beyond_loopback(collected: Path) -> None:
    """``--host 0.0.0.0`` is allowed, with a warning on stderr."""
    view = ViewProcess([str(collected), "--host", "0.0.0.0"])
    err = view.stop()
    assert "warning: --host 0.0.0.0 serves" in err


def test_collect_and_aggregate_print_the_view_command(collected: Path, tmp_path: Path) -> None:
    """Both commands end by printing the one line that opens the view; the report shows the
    run and links the rollouts that did not land by id."""
    runner = CliRunner()
    result = runner.invoke(cli, ["aggregate", str(collected)])
    assert f"view: trollout view {collected}" in result.stderr
    report = collected.with_name("r_report.html").read_text()
    assert "input sha256" in report
    assert 'href="rollout/0/4/0"' in report
    assert "&lt;img src=y onerror" in report  # the hostile class, escaped
    out = subprocess.run(
        [sys.executable, "-m", "trollout.cli.main", "--help"], capture_output=True, text=True
    )
    assert "view" in out.stdout


def test_settings_changed_lists_only_what_differs_from_the_defaults() -> None:
    """The one definition the report and the view share."""
    from trollout.metrics.run_info import default_settings

    settings = dict(default_settings(), num_repeats=4, input_jsonl_fpath="/x/in.jsonl")
    assert settings_changed(settings) == {"num_repeats": 4}
