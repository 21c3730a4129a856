"""Traces over a real run: one job span, one trace per dispatched attempt, linked, joined.

The run goes over loopback to `trollout.testing`'s fake deployment with mixed faults (a 500, a
429 retried within its attempt, a dropped connection re-sent as a new attempt, a producer's
failure class); spans are read from opentelemetry-sdk's in-memory exporter.
"""

from __future__ import annotations

from collections import Counter

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from builders import AGENT, materialized_rows
from trollout.collector.engine.collector import open_collector
from trollout.records import Failed, Landed
from trollout.settings import RunConfig
from trollout.telemetry import TelemetrySettings
from trollout.telemetry.runtime import open_telemetry
from trollout.telemetry.traces import ROLLOUT_REPEAT_ATTRIBUTE, TASK_ID_ATTRIBUTE, Tracing
from trollout.testing import AgentSpec, DeploymentSpec, Fault, FaultContext, open_fake_deployment

SPEC = DeploymentSpec(agents=(AgentSpec(name=AGENT),))
PARENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"
CONFIG = RunConfig(
    num_samples_in_parallel=4,
    retry_requests=True,
    retry_backoff_base_s=0.0,
    retry_backoff_max_s=0.0,
    max_connect_retries=0,
)


def mixed_faults(context: FaultContext) -> Fault | None:
    """Task 1: 500. Task 2: one 429. Task 3: attempt 0 dropped. Task 4: a producer's class."""
    task, first = context.task_index, context.request_index == 0
    if task == 1:
        return Fault(kind="status", status=500, body="boom")
    if task == 2 and first:
        return Fault(kind="status", status=429, retry_after=0)
    if task == 3 and context.attempt_index == 0:
        return Fault(kind="disconnect")
    if task == 4:
        return Fault(kind="failure_class", failure_class="transient")
    return None


def dispatch_spans(spans: tuple[ReadableSpan, ...]) -> dict[tuple[int, int], ReadableSpan]:
    """Return the attempt spans keyed by (task, attempt); each key once."""
    keyed: dict[tuple[int, int], ReadableSpan] = {}
    for span in spans:
        if span.name == "dispatch":
            attrs = span.attributes or {}
            key = (int(attrs["trollout.task.index"]), int(attrs["trollout.attempt"]))  # type: ignore[arg-type]
            assert key not in keyed, f"two spans for {key}"
            keyed[key] = span
    return keyed


async def test_traces_one_job_span_and_one_linked_trace_per_attempt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Job under TRACEPARENT; each attempt its own root, linked; every /run carries its id."""
    monkeypatch.setenv("TRACEPARENT", f"00-{PARENT_TRACE}-{PARENT_SPAN}-01")
    exporter = InMemorySpanExporter()
    rows = materialized_rows(6)
    async with (
        open_fake_deployment(SPEC, fault_fn=mixed_faults) as fake,
        open_telemetry(TelemetrySettings(), max_attempts=3, span_exporter=exporter) as telemetry,
        open_collector(
            config=CONFIG, urls=fake.run_urls, observer=telemetry, retain_outcomes=True
        ) as collector,
    ):
        telemetry.watch(collector, expected=len(rows), attributes={"trollout.run.id": "r1"})
        await collector.collect(rows)
        outcomes = collector.drain_nowait()
    spans = exporter.get_finished_spans()

    jobs = [span for span in spans if span.name == "job"]
    assert len(jobs) == 1
    job = jobs[0]
    assert format(job.context.trace_id, "032x") == PARENT_TRACE
    assert job.parent is not None
    assert format(job.parent.span_id, "016x") == PARENT_SPAN
    assert job.attributes is not None
    assert job.attributes["trollout.run.id"] == "r1"
    assert job.attributes["trollout.rollouts.landed"] == 4

    attempts = dispatch_spans(spans)
    seen = {(run.task_index, run.attempt_index) for run in fake.stats.runs}
    assert set(attempts) == seen == {(t, 0) for t in range(6)} | {(3, 1)}
    assert len({span.context.trace_id for span in attempts.values()}) == len(attempts)
    for span in attempts.values():
        assert span.parent is None  # its own root
        assert [link.context for link in span.links] == [job.context]

    by_key = {(o.identity.task_index, o.attempt_index): o for o in outcomes}
    for key, span in attempts.items():
        attrs = span.attributes or {}
        assert attrs[TASK_ID_ATTRIBUTE] == str(key[0])
        assert attrs[ROLLOUT_REPEAT_ATTRIBUTE] == 0
        assert attrs["trollout.agent"] == AGENT
        outcome = by_key[key]
        if isinstance(outcome, Landed):
            assert attrs["trollout.outcome"] == "landed"
            assert span.status.status_code is not StatusCode.ERROR
        else:
            assert isinstance(outcome, Failed)
            assert attrs["trollout.outcome"] == "failed"
            assert attrs["trollout.failure_class"] == outcome.failure_class
            assert attrs["trollout.failure_kind"] == outcome.kind
            assert span.status.status_code is StatusCode.ERROR
    assert attempts[(2, 0)].attributes["trollout.retries"] == 1  # type: ignore[index]
    assert [e.name for e in attempts[(2, 0)].events] == ["retry_wait"]
    assert attempts[(3, 0)].attributes["trollout.failure_kind"] == by_key[(3, 0)].kind  # type: ignore[index, union-attr]
    assert attempts[(4, 0)].attributes["trollout.failure_class"] == "transient"  # type: ignore[index]

    # Every /run carried its attempt's trace: the 429 and its re-send share one.
    requests = Counter((run.task_index, run.attempt_index) for run in fake.stats.runs)
    assert requests[(2, 0)] == 2
    for run in fake.stats.runs:
        assert run.traceparent is not None
        version, trace_id, span_id, flags = run.traceparent.split("-")
        span = attempts[(run.task_index, run.attempt_index)]
        assert version == "00"
        assert int(flags, 16) & 1
        assert trace_id == format(span.context.trace_id, "032x")
        assert span_id == format(span.context.span_id, "016x")


async def test_traces_off_sends_no_traceparent() -> None:
    """Without an observer the /run requests carry no trace header (off means off)."""
    async with (
        open_fake_deployment(SPEC) as fake,
        open_collector(config=CONFIG, urls=fake.run_urls) as collector,
    ):
        await collector.collect(materialized_rows(3))
    assert [run.traceparent for run in fake.stats.runs] == [None, None, None]


async def test_traces_a_failing_hook_never_fails_a_rollout(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A tracer that raises: every rollout still lands, sent without a trace header."""

    def broken(*args: object) -> None:
        raise RuntimeError("tracer broke")

    monkeypatch.setattr(Tracing, "start_attempt", broken)
    async with (
        open_fake_deployment(SPEC) as fake,
        open_telemetry(
            TelemetrySettings(), max_attempts=3, span_exporter=InMemorySpanExporter()
        ) as telemetry,
        open_collector(
            config=CONFIG, urls=fake.run_urls, observer=telemetry, retain_outcomes=True
        ) as collector,
    ):
        telemetry.watch(collector, expected=4)
        await collector.collect(materialized_rows(4))
        outcomes = collector.drain_nowait()
    assert [type(o) for o in outcomes] == [Landed] * 4
    assert [run.traceparent for run in fake.stats.runs] == [None] * 4
    assert sum("tracer broke" in r.getMessage() for r in caplog.records) == 1  # logged once
