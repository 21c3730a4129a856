"""`run_examples`' enrichment parameters, as NeMo Gym 0.7.0's page describes them.

``enrich_results`` attaches what collection records (``ng_model_call_capture``,
``ng_trajectory``, ``ng_perf``) to each result; off, results are exactly what ``/run`` returned,
whatever the helper's observability settings; ``include_model_call_payloads`` and
``delete_model_call_capture`` act on this call; ``record_shard`` implies ``enrich_results``.
The fake deployment's model server captures every call into a directory of this module (two
calls per rollout, `trollout.testing.capture`), as a NeMo Gym model server with capture on.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

import trollout
from builders import read_jsonl
from trollout.errors import ConfigError
from trollout.nemo_gym import BaseServerConfig, RolloutCollectionHelper
from trollout.testing import AgentSpec, DeploymentSpec, FakeUrls, task_rows

ENRICHMENT = ("ng_model_call_capture", "ng_trajectory", "ng_perf")


@pytest.fixture(scope="module")
def capture_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="trollout-capture-") as folder:
        yield Path(folder)


@pytest.fixture(scope="module")
def fake_spec(capture_dir: Path) -> DeploymentSpec:
    return DeploymentSpec(
        agents=(AgentSpec(name="math_agent"),), model_call_capture_dir=str(capture_dir)
    )


def helper(capture_dir: Path) -> RolloutCollectionHelper:
    """A helper whose config turns observability on, as NeMo Gym's global config would."""
    config = trollout.RunConfig(
        observability_enabled=True, model_call_capture_dir=str(capture_dir), max_attempts=1
    )
    return RolloutCollectionHelper(config=config)


def head(fake: FakeUrls) -> BaseServerConfig:
    parts = urlsplit(fake.head_url)
    return BaseServerConfig(host=parts.hostname or "", port=parts.port or 0)


def rows(n: int, seed: int) -> list[dict[str, Any]]:
    raw = [{**r, "agent_ref": {"name": "math_agent"}} for r in task_rows(n, seed=seed)]
    return RolloutCollectionHelper().preprocess_examples(raw)


def collect(completions: Any) -> list[tuple[dict[str, Any], Any]]:
    async def main() -> list[tuple[dict[str, Any], Any]]:
        return [await future for future in completions]

    return asyncio.run(main())


def run_examples(
    fake: FakeUrls, capture_dir: Path, given: list[dict[str, Any]], **options: Any
) -> list[tuple[dict[str, Any], Any]]:
    """Every pair of one `run_examples` call through the capturing `helper`."""
    return collect(
        helper(capture_dir).run_examples(given, head_server_config=head(fake), **options)
    )


def calls(result: dict[str, Any]) -> list[dict[str, Any]]:
    return list(result["ng_model_call_capture"]["calls"])


def bodies(result: dict[str, Any]) -> list[Any]:
    """The request bodies the trajectory's model calls hold (they own the payloads once the
    trajectory is projected; the capture's calls keep metadata only, as NeMo Gym's)."""
    return [call.get("request") for call in result["ng_trajectory"].get("model_calls", [])]


def test_enrich_results_attaches_what_collection_records(fake: FakeUrls, capture_dir: Path) -> None:
    """Every result carries its two captured calls (with payloads), the trajectory and perf;
    reward and the reply's own fields are untouched; rows are the copies dispatched."""
    given = rows(3, seed=11)
    pairs = run_examples(fake, capture_dir, given, enrich_results=True)
    assert len(pairs) == 3
    for row, result in pairs:
        assert all(key in result for key in ENRICHMENT), sorted(result)
        assert len(calls(result)) == 2
        assert len(bodies(result)) == 2
        assert all(body is not None for body in bodies(result))
        assert result["reward"] in (0.0, 1.0)
        assert (result["ng_perf"]["num_turns"], result["ng_perf"]["num_tool_calls"]) == (2, 1)
        assert row["_ng_rollout_id"].startswith(row["_ng_run_id"] + "-")  # the dispatched copy
    assert not any(row is g for row, _ in pairs for g in given)


def test_without_enrich_results_the_result_is_the_reply_as_it_came(
    fake: FakeUrls, capture_dir: Path
) -> None:
    """Observability on in the helper's config, enrich_results off (NeMo Gym's default):
    nothing is attached, and the pairs' rows are the caller's own."""
    given = rows(3, seed=12)
    pairs = run_examples(fake, capture_dir, given)
    assert len(pairs) == 3
    for row, result in pairs:
        assert "ng_model_call_capture" not in result
        assert "ng_perf" not in result
        assert any(row is g for g in given)


def test_payloads_left_out_and_captures_deleted_on_request(
    fake: FakeUrls, capture_dir: Path
) -> None:
    """include_model_call_payloads=False keeps call metadata only; delete_model_call_capture
    removes each rollout's capture file once merged (with the payloads kept)."""
    lean = run_examples(
        fake, capture_dir, rows(2, seed=13), enrich_results=True, include_model_call_payloads=False
    )
    for _, result in lean:
        assert len(calls(result)) == 2
        assert all(body is None for body in bodies(result))
        assert not any("request" in call or "response" in call for call in calls(result))
    kept = {p.name for p in capture_dir.iterdir()}
    deleted = run_examples(
        fake, capture_dir, rows(2, seed=14), enrich_results=True, delete_model_call_capture=True
    )
    for _, result in deleted:
        assert len(calls(result)) == 2
    assert {p.name for p in capture_dir.iterdir()} <= kept  # this call's files are gone


def test_deleting_captures_without_payloads_is_refused_before_anything_is_sent(
    fake: FakeUrls, capture_dir: Path
) -> None:
    before = httpx.get(fake.head_url + "/_fake/stats", timeout=30).json()["runs_total"]
    with pytest.raises(ConfigError, match="delete_model_call_capture"):
        helper(capture_dir).run_examples(
            rows(1, seed=15),
            enrich_results=True,
            include_model_call_payloads=False,
            delete_model_call_capture=True,
        )
    assert httpx.get(fake.head_url + "/_fake/stats", timeout=30).json()["runs_total"] == before


def test_a_recorded_shard_is_enriched(fake: FakeUrls, capture_dir: Path, tmp_path: Path) -> None:
    """record_shard implies enrich_results (NeMo Gym's page): the pairs and the shard's rows
    carry the enrichment collection would record."""
    pairs = run_examples(
        fake, capture_dir, rows(2, seed=16), record_output_dir=tmp_path, record_shard="step-1"
    )
    assert all(all(key in result for key in ENRICHMENT) for _, result in pairs)
    recorded = read_jsonl(tmp_path / "rollouts-step-1.jsonl")
    assert len(recorded) == 2
    assert all(all(key in row for key in ENRICHMENT) for row in recorded)


def test_enriched_a_routed_failure_is_the_typed_record(fake: FakeUrls, capture_dir: Path) -> None:
    """With enrich_results, a failed /run under route_failures_to_sidecar comes back as the
    typed failure record (as run_outcomes returns it); without, as the failure row."""
    given = rows(2, seed=17)
    given[1]["fake_fault"] = {"kind": "status", "status": 500, "body": "boom"}

    def failure(enrich: bool) -> Any:
        pairs = run_examples(
            fake, capture_dir, given, route_failures_to_sidecar=True, enrich_results=enrich
        )
        (failed,) = [result for row, result in pairs if row["_ng_task_index"] == 1]
        return failed

    typed = failure(True)
    assert isinstance(typed, trollout.Failed)
    assert typed.identity.task_index == 1
    plain = failure(False)
    assert isinstance(plain, dict)
    assert plain["_ng_failure_class"] == typed.failure_class


def test_rows_never_preprocessed_keep_the_plain_path(fake: FakeUrls, capture_dir: Path) -> None:
    """Rows with no rollout identity (no indices) keep NeMo Gym's plain dispatch even with
    enrich_results: the pairs' rows are the caller's own and a routed failure is the row."""
    given = [{**r, "agent_ref": {"name": "math_agent"}} for r in task_rows(2, seed=18)]
    given[1]["fake_fault"] = {"kind": "status", "status": 500, "body": "boom"}
    assert not any("_ng_task_index" in row for row in given)
    pairs = run_examples(
        fake, capture_dir, given, route_failures_to_sidecar=True, enrich_results=True
    )
    assert sorted(id(row) for row, _ in pairs) == sorted(map(id, given))
    (failed,) = [result for row, result in pairs if row is given[1]]
    assert isinstance(failed, dict)
    assert failed["_ng_failure_class"]
