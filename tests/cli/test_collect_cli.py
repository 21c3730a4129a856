"""`trollout collect` from the command line: bad input is refused before anything happens."""

from __future__ import annotations

import json
import os
import random
import socket
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from builders import connections, serve_head_config, without_hanging
from trollout.cli.main import cli
from trollout.testing import AgentSpec, DeploymentSpec, spawn_fake_deployment

ROW = {
    "responses_create_params": {"input": [{"role": "user", "content": "What is 1 + 1?"}]},
    "expected_answer": "2",
    "agent_ref": {"name": "math_agent"},
}


def write_input(path: Path, lines: list[str]) -> Path:
    """Write raw JSONL lines."""
    path.write_text("\n".join(lines) + "\n")
    return path


def run_collect(tmp_path: Path, listener: socket.socket, lines: list[str], *extra: str):
    """Run collect on the given lines against the never-answering listener."""
    source = write_input(tmp_path / "in.jsonl", lines)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    return CliRunner().invoke(
        cli,
        [
            "collect",
            str(source),
            "-o",
            str(tmp_path / "out" / "r.jsonl"),
            "--agent-url",
            f"math_agent={url}",
            "--progress",
            "plain",
            *extra,
        ],
    )


BAD_INPUTS = {
    "malformed line": ([json.dumps(ROW), "{not json", json.dumps(ROW)], (), "in.jsonl:2"),
    "unknown agent": ([json.dumps({**ROW, "agent_ref": {"name": "nobody"}})], (), "nobody"),
    "reserved rollout id": ([json.dumps({**ROW, "_ng_rollout_id": "x-a3"})], (), "-a3"),
    "num_repeats 0": ([json.dumps(ROW)], ("+num_repeats=0",), "num_repeats"),
    "missing responses_create_params": (
        [json.dumps({"expected_answer": "2", "agent_ref": {"name": "math_agent"}})],
        (),
        "responses_create_params",
    ),
    "unknown setting": ([json.dumps(ROW)], ("+num_repeat=2",), "num_repeats"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_collect_bad_input_exits_2_with_one_line_and_no_side_effects(
    case: str, tmp_path: Path, listener: socket.socket
) -> None:
    """Bad input: one line naming the problem, exit 2, nothing dispatched, no files written."""
    lines, extra, needle = BAD_INPUTS[case]
    result = run_collect(tmp_path, listener, lines, *extra)
    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, result.stderr
    assert needle in errors[0]
    assert "Traceback" not in result.output
    assert connections(listener) == 0
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_collect_help_explains_overrides() -> None:
    """--help names the +key=value overrides and the main options."""
    result = CliRunner().invoke(cli, ["collect", "--help"])
    assert result.exit_code == 0
    for needle in ("+key=value", "--concurrency", "--agent-url", "--num-repeats"):
        assert needle in result.output


# --- validated once, before anything is written (issue 8) ---------------------------------

SECRET = "sk-validate-0123456789abcdef"  # stands for an API key in a head server's config
DEEP = 50_000
BILLION_LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True)
)


def run_refused(
    tmp_path: Path, lines: list[str] | None, *args: str, source: Path | None = None
) -> tuple[str, list[str]]:
    """Run collect into a folder holding one earlier file; assert exit 2 and nothing touched.

    Returns the one error line and the arguments used (for the caller's own checks).
    """
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    earlier = out / "earlier.jsonl"
    earlier.write_text('{"kept": true}\n')
    if source is None:
        source = write_input(tmp_path / "in.jsonl", lines or [json.dumps(ROW)])
    argv = ["collect", str(source), "-o", str(out / "r.jsonl"), "--progress", "plain", *args]
    if not any(a.startswith(("--agent-url", "--head-server")) for a in args):
        argv += ["--agent-url", "math_agent=http://127.0.0.1:1"]
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 2, (result.output, result.exception)
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["earlier.jsonl"]
    assert earlier.read_text() == '{"kept": true}\n'
    return errors[0], argv


NUMERIC_OPTIONS = {
    "read-timeout nan": (("--read-timeout", "nan"), "read_timeout_s must be"),
    "connect_timeout_s nan": (("+connect_timeout_s=nan",), "connect_timeout_s must be"),
    "rollout-timeout nan": (("--rollout-timeout", "nan"), "rollout_timeout_s must be"),
    "budget nan": (("--budget", "nan"), "dispatch_budget_s must be"),
    "budget 0": (("--budget", "0"), "a budget of 0 starts no rollout"),
    "connect-timeout inf": (("--connect-timeout", "inf"), "connect_timeout_s must be"),
    "read-timeout 1e300": (("--read-timeout", "1e300"), "at most 1e9 (got 1e+300)"),
    "max-run-time -1": (("--max-run-time", "-1"), "max_run_time_s must be"),
    "grace -inf": (("--grace", "-inf"), "grace_s must be"),
    "seed 2**64": (("--seed", str(2**64)), "seed must be an integer from 0 to 2**64 - 1"),
    "seed -1": (("--seed", "-1"), "seed must be an integer from 0 to 2**64 - 1"),
    "concurrency 1e9": (
        ("+num_samples_in_parallel=1e9",),
        "(got 1000000000.0); write it as an integer: 1000000000",
    ),
    "concurrency 0": (("--concurrency", "0"), "num_samples_in_parallel must be"),
    "num-repeats 2**64": (("--num-repeats", str(2**64)), "num_repeats must be"),
    "fail_fast 1": (("+fail_fast=1",), "fail_fast must be true or false (got 1)"),
    "max-line-bytes 0": (("--max-line-bytes", "0"), "max_input_line_bytes must be"),
    "status_interval_s 2**64": ((f"+status_interval_s={2**64}",), "status_interval_s must be"),
}


@pytest.mark.parametrize("case", sorted(NUMERIC_OPTIONS))
def test_collect_refuses_bad_numbers_before_writing(case: str, tmp_path: Path) -> None:
    """NaN, inf, huge, negative, fractional-where-integral: exit 2, one line, no file written."""
    args, needle = NUMERIC_OPTIONS[case]
    error, _ = run_refused(tmp_path, None, *args)
    assert needle in error


def test_collect_refuses_a_deep_override_without_recursion_error(tmp_path: Path) -> None:
    """A 50,000-deep +key=[[[... is refused naming the key and the depth limit."""
    error, _ = run_refused(tmp_path, None, "+responses_create_params=" + "[" * DEEP)
    assert "override +responses_create_params: override value nests deeper than 100" in error


@pytest.mark.parametrize("depth", [129, 300, 1023])
def test_collect_refuses_rows_nested_deeper_than_writing_can_take(
    tmp_path: Path, depth: int
) -> None:
    """A row nested past 128 levels (orjson reads 1024, writes 254) is refused at file:line."""
    nested = "[" * (depth - 1) + "]" * (depth - 1)  # inside the row's own object: depth levels
    deep = json.dumps(ROW)[:-1] + f', "x": {nested}}}'
    error, _ = run_refused(tmp_path, [json.dumps(ROW), deep])
    assert "in.jsonl:2: the row nests deeper than 128 levels" in error


@pytest.mark.parametrize(
    ("yaml_text", "needle"),
    [
        (BILLION_LAUGHS, "uses an alias of a mapping or list at line 2, column"),
        ("responses_create_params: " + "[" * DEEP, "nests deeper than 100 levels at line 1"),
        ("base: &b {x: 1}\nresponses_create_params:\n  <<: *b\n", "alias of a mapping or list"),
    ],
    ids=["billion-laughs", "deep", "merge-key"],
)
def test_collect_refuses_expanding_or_deep_yaml_configs(
    tmp_path: Path, yaml_text: str, needle: str
) -> None:
    """--config YAML with collection aliases or deep nesting: refused naming file and line."""
    config = tmp_path / "run.yaml"
    config.write_text(yaml_text)
    error, _ = run_refused(tmp_path, None, "--config", str(config))
    assert f"config file {str(config)!r} " in error
    assert needle in error


def test_collect_refuses_a_line_longer_than_the_limit(tmp_path: Path) -> None:
    """A line past --max-line-bytes is refused naming file:line and the limit."""
    lines = [json.dumps(ROW), json.dumps({**ROW, "pad": "x" * 2000})]
    error, _ = run_refused(tmp_path, lines, "--max-line-bytes", "1000")
    assert "in.jsonl:2: line is longer than 1,000 bytes" in error


def test_collect_ends_promptly_on_random_bytes_with_no_newline(tmp_path: Path) -> None:
    """/dev/urandom-like input (random bytes, no newline) is refused at line 1 by the limit."""
    data = random.Random(8).randbytes(1 << 20).replace(b"\n", b" ")
    source = tmp_path / "random.bin"
    source.write_bytes(data)
    error, _ = run_refused(tmp_path, None, "--max-line-bytes", "65536", source=source)
    assert "random.bin:1: line is longer than 65,536 bytes" in error


def test_collect_refuses_a_sparse_file_with_no_newline(tmp_path: Path) -> None:
    """A /dev/zero-like file (256 MiB of zeros, sparse) stops at the default 64 MiB limit."""
    source = tmp_path / "zeros.jsonl"
    with source.open("wb") as f:
        f.truncate(256 << 20)
    error, _ = run_refused(tmp_path, None, source=source)
    assert "zeros.jsonl:1: line is longer than 67,108,864 bytes" in error


def _serve_unix_socket(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    return sock


@pytest.mark.parametrize("kind", ["fifo", "socket", "directory"])
def test_collect_refuses_special_files_as_input(tmp_path: Path, kind: str) -> None:
    """A FIFO, socket or directory as INPUT is refused without opening it (no hang)."""
    source = tmp_path / f"input-{kind}"
    if kind == "fifo":
        os.mkfifo(source)
    elif kind == "socket":
        _serve_unix_socket(source).close()
    else:
        source.mkdir()
    outcome: list[tuple[str, list[str]]] = []
    worker = threading.Thread(
        target=lambda: outcome.append(run_refused(tmp_path, None, source=source)), daemon=True
    )
    worker.start()
    worker.join(timeout=120)  # a watchdog only: opening a FIFO would block forever
    assert not worker.is_alive(), "collect blocked on the input"
    assert outcome, "collect raised"
    error, _ = outcome[0]
    expected = "a directory" if kind == "directory" else "not a regular file"
    assert f"input-{kind}: the input is" in error
    assert expected in error


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--agent-url", "math_agent=https://127.0.0.1:1"), "URL of agent 'math_agent'"),
        (("--head-server", "https://127.0.0.1:1"), "head server URL"),
        (
            ("+server_queue_metrics_urls=[https://127.0.0.1:1/metrics]",),
            "server_queue_metrics_urls entry",
        ),
    ],
    ids=["agent-url", "head-server", "metrics-url"],
)
def test_collect_refuses_https_urls_up_front(
    tmp_path: Path, args: tuple[str, ...], needle: str
) -> None:
    """https:// is refused before anything happens: trollout speaks plain http://."""
    error, _ = run_refused(tmp_path, None, *args)
    assert needle in error
    assert "must be a plain http:// URL (got 'https://127.0.0.1:1" in error


EMPTY_PLANS = {
    "empty file": ([""], (), "holds no rows"),
    "blank lines": (["", "   ", "\t"], (), "holds no rows"),
    "limit 0": ([json.dumps(ROW)], ("--limit", "0"), "limit 0 keeps no task"),
    "task_ids []": ([json.dumps(ROW)], ("+task_ids=[]",), "task_ids [] keep no task"),
    "task_ids outside limit": (
        [json.dumps({**ROW, "task_id": "a"}), json.dumps({**ROW, "task_id": "b"})],
        ("--limit", "1", "+task_ids=[b]"),
        "(limit 1 keeps the first 1)",
    ),
}


@pytest.mark.parametrize("case", sorted(EMPTY_PLANS))
def test_collect_refuses_an_empty_plan(tmp_path: Path, case: str) -> None:
    """A run that would collect nothing exits 2 saying why, never a silent success."""
    lines, args, needle = EMPTY_PLANS[case]
    error, _ = run_refused(tmp_path, lines, *args)
    assert needle in error


def _agent_block(host: str) -> str:
    return (
        "math_agent:\n  responses_api_agents:\n    simple_agent:\n"
        f"      host: {host}\n      port: 1\n      api_key: {SECRET}\n"
    )


@pytest.mark.parametrize(
    ("yaml_text", "needle"),
    [
        (_agent_block("127.0.0.1") + BILLION_LAUGHS, "uses an alias of a mapping or list at line"),
        (_agent_block("127.0.0.1") + "deep: " + "[" * DEEP, "nests deeper than 100 levels at"),
        (_agent_block("https://127.0.0.1"), "'math_agent.responses_api_agents.simple_agent.host'"),
        (f"key: {SECRET}\nbad: [unclosed {SECRET}\n", "is not valid YAML at line 3, column 1"),
    ],
    ids=["billion-laughs", "deep", "https-host", "broken"],
)
def test_collect_refuses_a_head_server_config_naming_line_never_text(
    tmp_path: Path, yaml_text: str, needle: str
) -> None:
    """A head server's bad config: exit 2, line/column or key path, its text never echoed."""
    with serve_head_config(yaml_text) as url:
        error, _ = run_refused(tmp_path, None, "--head-server", url)
    assert needle in error
    assert SECRET not in error
    assert "lol" not in error


def test_collect_runs_with_every_duration_and_the_seed_at_their_bounds(tmp_path: Path) -> None:
    """1e9 s timeouts, budget, run time and grace, and seed 2**64 - 1 work end to end."""
    source = write_input(tmp_path / "in.jsonl", [json.dumps(ROW)])
    out = tmp_path / "out" / "r.jsonl"
    spec = DeploymentSpec(agents=(AgentSpec(name="math_agent"),))
    with spawn_fake_deployment(spec) as urls:
        result = CliRunner().invoke(
            cli,
            [
                "collect",
                str(source),
                "-o",
                str(out),
                "--head-server",
                urls.head_url,
                "--progress",
                "plain",
                "--add-seed",
                "--seed",
                str(2**64 - 1),
                *("--connect-timeout", "1e9", "--read-timeout", "1e9"),
                *("--rollout-timeout", "1e9", "--budget", "1e9"),
                *("--max-run-time", "1e9", "--grace", "1e9"),
            ],
        )
    assert result.exit_code == 0, (result.output, result.exception)
    [landed] = [json.loads(line) for line in out.read_text().splitlines()]
    manifest = json.loads((tmp_path / "out" / "r_manifest.json").read_text())
    assert manifest["settings"]["seed"] == 2**64 - 1
    assert landed["_ng_task_index"] == 0


def test_collect_prompt_config_fifo_exits_2_without_opening_it(tmp_path: Path) -> None:
    """+prompt_config=<FIFO>: exit 2 at once, one line naming it, nothing written."""
    fifo = tmp_path / "prompt.yaml"
    os.mkfifo(fifo)
    row = {"q": "1 + 1", "agent_ref": {"name": "math_agent"}}
    error, _ = without_hanging(
        lambda: run_refused(tmp_path, [json.dumps(row)], f"+prompt_config={fifo}"), fifo
    )
    assert f"{fifo}: prompt_config is a pipe or FIFO, not a regular file" in error


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--observability"], "model_call_capture_dir is required"),
        (["--observability", "--model-call-capture-dir", "rel/dir"], "absolute path"),
        (
            ["+delete_model_call_capture=true", "+include_model_call_payloads=false"],
            "needs include_model_call_payloads=true",
        ),
    ],
)
def test_collect_refuses_contradictory_enrichment_settings(
    tmp_path: Path, args: list[str], says: str
) -> None:
    """Enrichment settings that cannot work: exit 2, one line naming the key, nothing written."""
    error, _ = run_refused(tmp_path, None, *args)
    assert says in error
