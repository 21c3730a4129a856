"""``prompt_config`` expansion is held to the input line limit and counted for the free space.

A template repeats its fields at will: a few kilobytes of rows must not become gigabytes of
messages, in memory or on disk (issue 22). The unit tests plan with `plan_rollouts` under
tracemalloc; the CLI tests run ``trollout collect`` in process against an agent that is never
reached (everything here is refused, or counted, before the first request).
"""

from __future__ import annotations

import json
import shutil
import tracemalloc
from collections import namedtuple
from pathlib import Path
from typing import Any

import attrs
import pytest
from plan_router import direct_router

from builders import invoke
from trollout.collector.planning.plan import Plan, plan_rollouts
from trollout.errors import InputError
from trollout.settings import RunConfig

LIMIT = 64 * 1024
Usage = namedtuple("Usage", "total used free")


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Write rows as JSONL."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_prompt(tmp_path: Path, user: str) -> str:
    """Write a prompt file whose user template is ``user``; return its path."""
    path = tmp_path / "prompt.yaml"
    path.write_text(f"user: {json.dumps(user)}\n", encoding="utf-8")
    return str(path)


def traced_plan(source: Path, config: RunConfig) -> tuple[Plan | InputError, int]:
    """Plan under tracemalloc; return the plan (or its refusal) and the peak in bytes.

    The peak is measured above a plan of the same rows with a one-field template, so the fixed
    costs (reading the prompt file, loading YAML, the input's buffers) cancel out.
    """
    baseline_prompt = Path(str(config.prompt_config)).with_name("baseline.yaml")
    baseline_prompt.write_text("user: '{q}'\n", encoding="utf-8")
    baseline = attrs.evolve(config, prompt_config=str(baseline_prompt))
    result, peak = _traced(source, config)
    return result, peak - _traced(source, baseline)[1]


def _traced(source: Path, config: RunConfig) -> tuple[Plan | InputError, int]:
    tracemalloc.start()
    try:
        try:
            result: Plan | InputError = plan_rollouts(source, config, direct_router())
        except InputError as exc:
            result = exc
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return result, peak


def test_a_row_expanding_past_the_limit_is_refused_holding_about_the_limit(
    tmp_path: Path,
) -> None:
    """{q} 10,000 times over a 1 KB field (10 MB a row): refused, memory about the limit."""
    prompt = write_prompt(tmp_path, "{q}" * 10_000)
    source = write_rows(tmp_path / "in.jsonl", [{"q": "x" * 1000}, {"q": "y"}])
    config = RunConfig(prompt_config=prompt, agent_name="alpha", max_input_line_bytes=LIMIT)
    refused, peak = traced_plan(source, config)
    assert isinstance(refused, InputError), refused
    assert refused.problems == (
        f"{source}:1: prompt_config {prompt!r} expands this row past 65,536 bytes (the input "
        "line limit); shorten the template or the row's fields, or raise --max-line-bytes "
        "(+max_input_line_bytes)",
    )
    # The messages stop at the first piece past the limit: about the limit and one 1 KB piece
    # (with the list holding the pieces), never the 10 MB the row would expand to.
    assert peak < 2 * LIMIT, peak


def test_a_width_past_the_limit_is_refused_before_the_piece_is_built(tmp_path: Path) -> None:
    """{q:>100000000} would be one 100 MB piece: refused from its width, never formatted."""
    prompt = write_prompt(tmp_path, "Solve {q:>100000000}")
    source = write_rows(tmp_path / "in.jsonl", [{"q": "1+1"}])
    config = RunConfig(prompt_config=prompt, agent_name="alpha", max_input_line_bytes=LIMIT)
    refused, peak = traced_plan(source, config)
    assert isinstance(refused, InputError), refused
    assert "expands this row past 65,536 bytes" in str(refused)
    assert peak < LIMIT, peak


def test_rows_within_the_limit_expand_and_are_counted_as_expanded(tmp_path: Path) -> None:
    """Rows just under the limit expand; materialized_bytes counts the expanded rows."""
    prompt = write_prompt(tmp_path, "{q}" * 50)
    rows = [{"q": "x" * 1000}, {"q": "y" * 1000}]
    source = write_rows(tmp_path / "in.jsonl", rows)
    config = RunConfig(
        prompt_config=prompt, agent_name="alpha", num_repeats=3, max_input_line_bytes=LIMIT
    )
    plan = plan_rollouts(source, config, direct_router())
    sizes = [len(json.dumps(body, separators=(",", ":")).encode()) for body in plan.bodies()]
    assert len(sizes) == 6
    assert min(sizes) > 50_000
    assert plan.materialized_bytes >= sum(sizes)  # the estimate the free-space check uses
    assert plan.materialized_bytes < sum(sizes) + 6 * 1024
    # With a selection (pass 2 counts the kept rows again), the same rows count the same.
    limited = plan_rollouts(source, attrs.evolve(config, limit=1), direct_router())
    assert limited.materialized_bytes * 2 == pytest.approx(plan.materialized_bytes, rel=0.01)


@pytest.mark.parametrize(
    ("template", "placeholder"), [("{q.real}", "{q.real}"), ("{q:d}", "{q}"), ("{q[9]}", "{q[9]}")]
)
def test_a_field_the_row_cannot_fill_is_refused_naming_it(
    tmp_path: Path, template: str, placeholder: str
) -> None:
    """A placeholder the row's value cannot fill is a line problem, not a traceback."""
    prompt = write_prompt(tmp_path, template)
    source = write_rows(tmp_path / "in.jsonl", [{"q": "text"}])
    with pytest.raises(InputError) as info:
        plan_rollouts(source, RunConfig(prompt_config=prompt, agent_name="alpha"), direct_router())
    assert str(info.value).startswith(f"{source}:1: prompt_config {prompt!r} cannot fill")
    assert placeholder in str(info.value)


def collect(tmp_path: Path, prompt: str, *extra: str) -> Any:
    """Run trollout collect over two rows with ``prompt``, against an agent never reached."""
    source = write_rows(tmp_path / "in.jsonl", [{"q": "x" * 100}, {"q": "y"}])
    return invoke("collect", str(source), "-o", str(tmp_path / "run" / "r.jsonl"),
                  "--agent-url", "alpha=http://127.0.0.1:9", "--agent", "alpha",
                  "--progress", "plain", f"+prompt_config={prompt}", *extra)  # fmt: skip


def refused_in_one_line(result: Any, *needles: str) -> str:
    """Exit 2, one line on stderr holding every needle, no traceback."""
    assert result.exit_code == 2, (result.output, result.exception)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return str(lines[0])


def test_collect_refuses_an_expansion_past_max_line_bytes_writing_nothing(
    tmp_path: Path,
) -> None:
    """--max-line-bytes 4096 and a template expanding a row to 10 kB: exit 2, one line."""
    prompt = write_prompt(tmp_path, "{q}" * 100)
    result = collect(tmp_path, prompt, "--max-line-bytes", "4096")
    line = refused_in_one_line(result, "in.jsonl:1", "prompt.yaml", "4,096 bytes")
    assert "--max-line-bytes" in line
    assert not (tmp_path / "run").exists()


def test_collect_counts_the_expansion_in_the_free_space_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 100 B row expanding to 10 kB needs more than 8 kB free (as read: 0.5 kB): refused."""
    prompt = write_prompt(tmp_path, "{q}" * 100)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**9, 10**9 - 8_000, 8_000))
    result = collect(tmp_path, prompt)
    refused_in_one_line(result, "2 rollouts need about", "8.0 kB free")
    assert not (tmp_path / "run").exists()
