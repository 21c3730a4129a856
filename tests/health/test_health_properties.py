"""Properties of the health check over generated runs built from NeMo Gym's real rows.

Each run takes rows of the healthy reference run and applies random edits of the kinds its
checker was shown (failed calls, zero or missing token counts, unresolvable references, empty
turns, no trajectory, a row written twice), in random order.
"""

from __future__ import annotations

import copy
import gzip
import json
import random
from pathlib import Path
from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from trollout.health import CHECKS, check_run

FIXTURES = Path(__file__).parents[1] / "fixtures" / "health"
BASE = [
    orjson.loads(line)
    for line in gzip.decompress(
        (FIXTURES / "obs_on_healthy" / "rollouts.jsonl.gz").read_bytes()
    ).splitlines()
]


def _fail(row: dict[str, Any]) -> None:
    for call in row["ng_trajectory"]["model_calls"]:
        call["response_metadata"]["status_code"] = 500


def _zero(row: dict[str, Any]) -> None:
    row["ng_trajectory"]["model_calls"][0]["token_stats"]["completion_tokens"] = 0


def _no_prompt(row: dict[str, Any]) -> None:
    row["ng_trajectory"]["model_calls"][0]["token_stats"]["prompt_tokens"] = None


def _unmatched(row: dict[str, Any]) -> None:
    row["ng_trajectory"]["turns"][-1]["model_calls"][0]["response_id"] = "resp_nowhere"


def _hollow(row: dict[str, Any]) -> None:
    row["ng_trajectory"]["turns"][-1]["answer"] = []


def _no_turns(row: dict[str, Any]) -> None:
    row["ng_trajectory"]["turns"] = []


def _no_trajectory(row: dict[str, Any]) -> None:
    del row["ng_trajectory"]


def _usage(row: dict[str, Any]) -> None:
    row["response"]["usage"]["input_tokens"] += 7


EDITS = [_fail, _zero, _no_prompt, _unmatched, _hollow, _no_turns, _no_trajectory, _usage]


@st.composite
def runs(draw: st.DrawFn) -> list[bytes]:
    """A run: some reference rows, each with a few edits; some written twice; shuffled."""
    picks = draw(st.lists(st.integers(0, len(BASE) - 1), min_size=1, max_size=12, unique=True))
    lines = []
    for index in picks:
        row = copy.deepcopy(BASE[index])
        for edit in draw(st.lists(st.sampled_from(EDITS), max_size=3, unique=True)):
            if "ng_trajectory" in row and row["ng_trajectory"]["turns"]:
                edit(row)
        line = json.dumps(row, separators=(",", ":")).encode()
        lines += [line] * draw(st.integers(1, 2))
    seed = draw(st.integers(0, 2**32 - 1))
    random.Random(seed).shuffle(lines)
    return lines


def _check(tmp: Path, name: str, lines: list[bytes], ignored: tuple[str, ...] = ()) -> Any:
    folder = tmp / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rollouts.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    report = check_run(folder / "rollouts.jsonl", folder, ignored_checks=ignored)
    verdicts = [
        json.loads(line) for line in (folder / "rollout_verdicts.jsonl").read_text().splitlines()
    ]
    return report, verdicts, (folder / "quality_summary.json").read_bytes()


@given(lines=runs())
def test_verdicts_add_up_to_rows_checked(lines: list[bytes], tmp_path_factory: Any) -> None:
    tmp = tmp_path_factory.mktemp("sum")
    report, verdicts, _ = _check(tmp, "run", lines)
    assert report.checked == len(lines) == len(verdicts)
    assert sum(report.verdicts.values()) == report.checked
    tasks = report.summary["tasks"].values()
    assert sum(t["healthy"] + t["unhealthy"] + t["unobserved"] for t in tasks) == sum(
        t["repeats"] for t in tasks
    )
    for check, coverage in report.summary["run"]["artifacts"]["coverage"].items():
        total = report.checked if check in CHECKS[:12] else len(report.summary["tasks"])
        assert sum(coverage.values()) == total, check


@given(lines=runs(), ignored=st.lists(st.sampled_from(CHECKS), max_size=4, unique=True))
def test_ignoring_checks_never_makes_a_rollout_worse(
    lines: list[bytes], ignored: list[str], tmp_path_factory: Any
) -> None:
    """Healthy stays healthy and unobserved never becomes unhealthy when checks are ignored."""
    tmp = tmp_path_factory.mktemp("ignore")
    _, before, _ = _check(tmp, "all", lines)
    report, after, _ = _check(tmp, "ignored", lines, tuple(ignored))
    assert len(before) == len(after)
    for old, new in zip(before, after, strict=True):
        assert old["rollout_id"] == new["rollout_id"]
        if old["verdict"] == "healthy":
            assert new["verdict"] == "healthy"
        if old["verdict"] == "unobserved":
            assert new["verdict"] != "unhealthy"
        assert not {f["check"] for f in new["findings"]} & set(ignored)
        assert not set(new["unobserved"]) & set(ignored)
    assert report.summary["run"]["ignored_checks"] == sorted(ignored)


@given(lines=runs(), seed=st.integers(0, 2**32 - 1))
def test_files_do_not_depend_on_row_order(
    lines: list[bytes], seed: int, tmp_path_factory: Any
) -> None:
    """Verdicts are sorted by identity and copies are identical: any order, the same files."""
    tmp = tmp_path_factory.mktemp("order")
    shuffled = list(lines)
    random.Random(seed).shuffle(shuffled)
    _, first, summary = _check(tmp, "a", lines)
    _, second, summary2 = _check(tmp, "b", shuffled)
    assert first == second
    assert summary == summary2
