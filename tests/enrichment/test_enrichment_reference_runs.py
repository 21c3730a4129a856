"""Enrichment against NeMo Gym 0.7.0's own runs: the same rows, re-enriched, are equal.

Each run's rows are taken apart the way the collector received them: the three enrichment keys
go, and ``ng_trajectory`` goes back to what the agent sent (the canonical record minus the
captured model calls and the gaps only the collector adds: the servers-only run shows that the
agent's record is exactly that). Enriching them again from the run's real capture files must
give NeMo Gym's ``ng_model_call_capture``, ``ng_trajectory`` and ``ng_perf`` exactly:
the timestamps and durations come from the capture files, and ``ng_perf.total_latency_ms``
(the collector's own clock) is passed in as NeMo Gym measured it.

Every case runs twice: on the project's own copies (tests/fixtures/enrichment, always) and on
the reference folder itself (skipped only when ../shared is absent).
"""

from __future__ import annotations

import gzip
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from trollout.enrichment import ENRICHMENT_KEYS, enrich_result, read_capture

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "enrichment"
REFERENCE = Path("/work/shared/reference/nemo_gym_0.7.0/observability/runs")
_RUN_DIRS = {
    "healthy": "obs_on_healthy",
    "model_500": "obs_on_model_500",
    "servers_only": "obs_servers_only",
}
_COLLECTOR_GAPS = {"model_calls_unavailable", "turns_unavailable", "conversation_unavailable"}


def _source(kind: str, run: str) -> Path:
    if kind == "fixtures":
        return FIXTURES / run
    if not REFERENCE.is_dir():
        pytest.skip("the NeMo Gym reference runs (../shared) are absent")
    return REFERENCE / _RUN_DIRS[run]


SOURCES = pytest.mark.parametrize("kind", ["fixtures", "reference"])


def _rows(folder: Path) -> list[dict[str, Any]]:
    with gzip.open(folder / "rollouts.jsonl.gz") as f:
        return [json.loads(line) for line in f]


def _as_received(row: dict[str, Any]) -> dict[str, Any]:
    """The row as the agent replied: no enrichment keys, the agent's own trajectory."""
    received = {k: v for k, v in row.items() if k not in ENRICHMENT_KEYS}
    trajectory = dict(row["ng_trajectory"])
    trajectory["model_calls"] = []
    trajectory["gaps"] = [
        g
        for g in trajectory["gaps"]
        if g["code"] not in _COLLECTOR_GAPS and not g["code"].startswith("model_call_capture")
    ]
    received["ng_trajectory"] = trajectory
    return received


def _key(row: dict[str, Any]) -> str:
    return f"{row['_ng_task_index']}-{row['_ng_rollout_index']}"


def _enrich_from(row: dict[str, Any], capture_dir: Path) -> Any:
    key = _key(row)
    return enrich_result(
        _as_received(row),
        key=key,
        task_id=str(row["_ng_task_index"]),
        observability=True,
        capture=read_capture(str(capture_dir), key, 1 << 26),
        latency_ms=row["ng_perf"]["total_latency_ms"],
    )


@SOURCES
def test_healthy_run_re_enriched_from_its_capture_files_equals_nemo_gyms(
    kind: str, tmp_path: Path
) -> None:
    """All 20 rows of the healthy run: the three keys equal NeMo Gym's, the rest untouched."""
    folder = _source(kind, "healthy")
    with tarfile.open(folder / "model-calls.all20.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    rows = _rows(folder)
    assert len(rows) == 20
    for row in rows:
        enriched = _enrich_from(row, tmp_path / "model-calls")
        assert enriched == row, _key(row)
        assert enriched["response"] is row["response"]  # harness output: the same object
        assert enriched["ng_model_call_capture"]["metrics"]["num_calls"] == 2


@SOURCES
def test_model_500_run_successful_rollout_equals_and_failed_call_is_metadata(kind: str) -> None:
    """1-0 landed (its capture re-enriches to NeMo Gym's row); 0-0's 500 call is recorded
    with no response, no tokens and ``upstream_error``, as the capture says."""
    folder = _source(kind, "model_500")
    rows = {(_key(r)): r for r in _rows(folder)}
    assert len(rows) == 14
    assert "0-0" not in rows  # 0-0 failed: a sidecar row, not enriched
    assert _enrich_from(rows["1-0"], folder / "model-calls") == rows["1-0"]
    failed = enrich_result(
        {"reward": 0.0},
        key="0-0",
        task_id="0",
        observability=True,
        capture=read_capture(str(folder / "model-calls"), "0-0", 1 << 26),
    )
    capture = failed["ng_model_call_capture"]
    call = capture["calls"][1]
    assert (call["status_code"], call["error_category"], call["response_id"]) == (
        500,
        "upstream_error",
        None,
    )
    assert call["tokens_in"] is None
    assert call["tool_calls"] == []
    assert capture["metrics"]["num_calls"] == 2
    assert capture["metrics"]["tokens_in"] == 126
    assert "gaps" not in capture


@SOURCES
def test_servers_only_run_projects_the_agents_trajectory_without_capture(kind: str) -> None:
    """Observability off in the collector: the agent's trajectory is projected (gap
    ``model_calls_unavailable``), no capture, no ng_perf: all 20 rows equal NeMo Gym's."""
    rows = _rows(_source(kind, "servers_only"))
    assert len(rows) == 20
    for row in rows:
        enriched = enrich_result(
            _as_received(row),
            key=_key(row),
            task_id=str(row["_ng_task_index"]),
            observability=False,
        )
        assert enriched == row
        assert "ng_perf" not in enriched
        assert "ng_model_call_capture" not in enriched
