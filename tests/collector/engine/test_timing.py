"""Tests of the run timing report: latency summary, stragglers, healthy-bound rows, queues."""

from __future__ import annotations

import math
from functools import partial

import httpx
import pytest
import trio
import trio.testing

import builders
from builders import identity
from trollout.collector.dispatch.retry import RetryCounters
from trollout.collector.engine.timing import (
    QueueSample,
    RunTimer,
    TimingBounds,
    parse_vllm_queue,
    percentile,
    sample_queues,
)
from trollout.records import Failed, Landed, OmitReason, Omitted
from trollout.settings import RunConfig, build_config

METRICS = """\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="a"} 3.0
vllm:num_requests_running{model_name="b, with space"} 1.0 1700000000000
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="a"} 5.0
vllm:num_requests_waiting 2
vllm:num_requests_waiting_total{model_name="a"} 99
"""


ident = partial(identity, agent="math")  # task `task`, rollout 0, of agent "math"
landed = partial(builders.landed, agent="math")


# --- pure helpers -------------------------------------------------------------------------------


def test_percentile_interpolates_linearly() -> None:
    """Quantiles interpolate between neighbours; an empty list gives NaN."""
    values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    assert percentile(values, 0.5) == 5.5
    assert percentile(values, 0.9) == pytest.approx(9.1)
    assert percentile(values, 1.0) == 10.0
    assert percentile([4.0], 0.99) == 4.0
    assert math.isnan(percentile([], 0.5))


def test_parse_vllm_queue_sums_every_series() -> None:
    """Labelled and bare series are summed; comments, timestamps and other metrics ignored."""
    assert parse_vllm_queue(METRICS) == (7.0, 4.0)


def test_parse_vllm_queue_needs_both_gauges() -> None:
    """Text without one of the gauges is no sample."""
    assert parse_vllm_queue("vllm:num_requests_running 3\n") is None
    assert parse_vllm_queue("<html>not metrics</html>") is None


def test_timing_bounds_from_config_takes_run_settings() -> None:
    """Every bound comes from the run's settings of the same name."""
    config = RunConfig(rollout_timeout_s=60.0, long_rollout_s=30.0, straggler_p90_multiple=2.0)
    bounds = TimingBounds.from_config(config)
    assert (bounds.rollout_timeout_s, bounds.long_rollout_s, bounds.straggler_p90_multiple) == (
        60.0,
        30.0,
        2.0,
    )


# --- the timer under the fake clock -------------------------------------------------------------


async def run_tasks(timer: RunTimer, durations: list[float]) -> None:
    """Start every task at once and finish task i after durations[i] (fake clock)."""

    async def one(task: int, seconds: float) -> None:
        await trio.sleep(seconds)
        timer.finished(landed(task))

    async with trio.open_nursery() as nursery:
        for task, seconds in enumerate(durations):
            timer.started(ident(task))
            nursery.start_soon(one, task, seconds)


async def test_timer_latency_summary_is_exact(autojump_clock: trio.testing.MockClock) -> None:
    """Median, p90, p99, max and task-hours come from the measured durations; drained counted."""
    timer = RunTimer()
    await run_tasks(timer, [float(s) for s in range(1, 11)])
    timer.finished(Omitted(ident(99), 0, OmitReason.DRAINED))
    timer.finished(Omitted(ident(98), 0, OmitReason.INTERRUPTED))
    summary = timer.latency()
    assert (summary.finished, summary.median_s, summary.max_s, summary.drained) == (10, 5.5, 10, 1)
    assert summary.p90_s == pytest.approx(9.1)
    assert summary.p99_s == pytest.approx(9.91)
    assert summary.task_hours == pytest.approx(55.0 / 3600.0)
    assert (timer.interrupted, timer.running) == (1, 0)


async def test_timer_lists_stragglers_past_the_p90_multiple(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A rollout running longer than 3 x p90 of finished ones is listed, only after that."""
    timer = RunTimer(TimingBounds(straggler_p90_multiple=3.0))
    timer.started(ident(100))  # the straggler, started at t=0
    await run_tasks(timer, [float(s) for s in range(1, 12)])  # p90 = 10, threshold 30
    await trio.sleep(30.0 - trio.current_time())
    assert timer.stragglers() == []
    await trio.sleep(0.5)
    (straggler,) = timer.stragglers()
    assert (straggler.identity, straggler.running_s, straggler.p90_multiple) == (
        ident(100),
        30.5,
        3.05,
    )
    report = timer.report()
    assert report.straggler_threshold_s == 30.0
    assert "task 100 rollout 0 (math): running 30.5s (3.0 x p90)" in report.render()


async def test_timer_needs_five_finished_before_stragglers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """With fewer than five finished rollouts there is no p90 to compare against."""
    timer = RunTimer()
    timer.started(ident(100))
    await run_tasks(timer, [1.0, 1.0, 1.0, 1.0])
    await trio.sleep(1000)
    assert timer.stragglers() == []
    assert math.isnan(timer.report().straggler_threshold_s)


async def test_timer_start_rows_compare_with_their_bounds(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Started-within and all-started rows warn when the dispatch ramp was too slow."""
    bounds = TimingBounds(
        dispatch_start_report_within_s=5.0,
        dispatch_start_report_min_fraction=0.5,
        dispatch_all_started_within_s=10.0,
    )
    timer = RunTimer(bounds, expected=10)
    timer.mark_dispatch_start()
    for task in range(10):
        timer.started(ident(task))
        await trio.sleep(1.5)  # starts at 0, 1.5, ..., 13.5
    rows = {row.check: row for row in timer.report().rows}
    within = rows["started within 5.0s of dispatch"]
    assert (within.value, within.ok) == ("40.0% (4 of 10)", False)
    everything = rows["all started"]
    assert (everything.value, everything.bound, everything.ok) == ("after 13.5s", "<= 10.0s", False)


async def test_timer_all_started_row_warns_while_late(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Before every rollout started the row has no verdict, then warns once past the bound."""
    timer = RunTimer(TimingBounds(dispatch_all_started_within_s=10.0), expected=3)
    timer.started(ident(0))
    assert timer.report().rows[1].ok is None
    await trio.sleep(10.5)
    row = timer.report().rows[1]
    assert (row.value, row.ok) == ("2 not started yet", False)


async def test_timer_timed_out_and_long_rows(autojump_clock: trio.testing.MockClock) -> None:
    """Rollouts ended by the limit and long rollouts are fractions of the finished ones."""
    bounds = TimingBounds(
        rollout_timeout_s=8.0,
        timed_out_max_fraction=0.1,
        long_rollout_s=5.0,
        long_rollout_max_fraction=0.5,
    )
    timer = RunTimer(bounds)
    await run_tasks(timer, [1.0, 2.0, 6.0])
    timer.started(ident(9))
    await trio.sleep(8.0)
    timer.finished(Failed(ident(9), 0, "agent_request_failed", kind="timeout"))
    _, _, timed_out, long, _ = timer.report().rows
    assert (timed_out.check, timed_out.value, timed_out.ok) == (
        "ended by the rollout limit (8.0s)",
        "25.0% (1 of 4)",
        False,
    )
    assert (long.check, long.value, long.ok) == ("longer than 5.0s", "50.0% (2 of 4)", True)


async def test_timer_counts_a_producers_timeout_exceeded(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A producer's own limit (class timeout_exceeded) is an end by the limit, set or not."""
    timer = RunTimer(TimingBounds(timed_out_max_fraction=0.25))
    await run_tasks(timer, [1.0, 1.0])
    timer.started(ident(9))
    timer.finished(Failed(ident(9), 0, "timeout_exceeded", terminal=True))
    timer.started(ident(10))
    legacy = {"_ng_failure_legacy_class": "timeout_exceeded"}
    timer.finished(Failed(ident(10), 0, "agent_run_error", extra=legacy))
    row = timer.report().rows[2]
    assert (row.check, row.value, row.ok) == ("ended by the rollout limit", "50.0% (2 of 4)", False)


def test_timer_start_row_is_judged_by_default_once_a_window_is_set() -> None:
    """dispatch_start_report_min_fraction has a default, so a window alone gives a verdict."""
    timer = RunTimer(
        TimingBounds(dispatch_start_report_within_s=5.0), expected=2, clock=lambda: 0.0
    )
    timer.started(ident(0))
    row = timer.report().rows[0]
    assert (row.value, row.bound, row.ok) == ("50.0% (1 of 2)", ">= 90.0%", False)
    assert build_config({}).dispatch_start_report_min_fraction == 0.9


def test_timer_rows_without_bounds_have_no_verdict() -> None:
    """With no limit, no long bound and no samples, rows say so and never warn."""
    report = RunTimer(clock=lambda: 0.0).report()
    assert [row.ok for row in report.rows] == [None] * 5
    assert report.warnings == []
    assert "no limit set (rollout_timeout_s)" in report.render()


def test_timer_queue_row_compares_waiting_with_running() -> None:
    """Mean waiting over mean running is checked against server_queue_max_waiting_ratio."""
    timer = RunTimer(TimingBounds(server_queue_max_waiting_ratio=0.5), clock=lambda: 0.0)
    timer.add_queue_sample(QueueSample(0.0, waiting=2.0, running=8.0, servers=2))
    timer.add_queue_sample(QueueSample(1.0, waiting=10.0, running=8.0, servers=2))
    timer.add_queue_sample(QueueSample(2.0, waiting=0.0, running=0.0, servers=0, errors=2))
    row = timer.report().rows[4]
    assert row.value == "0.75 (mean waiting 6.0, peak 10; mean running 8.0; 2 samples)"
    assert (row.bound, row.ok) == ("<= 0.5", False)
    assert timer.report().warnings == [row]


def test_timer_queue_row_reports_failed_reads() -> None:
    """Rounds where no server answered are reported, with no verdict."""
    timer = RunTimer(clock=lambda: 0.0)
    timer.add_queue_sample(QueueSample(0.0, 0.0, 0.0, servers=0, errors=3))
    assert timer.report().rows[4].value == "no answer (3 failed reads)"


async def test_report_render_shows_rows_latency_and_retries(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The rendered report has a header, one line per row, latency and the retry counters."""
    timer = RunTimer(TimingBounds(dispatch_start_report_within_s=60.0), expected=2)
    await run_tasks(timer, [2.0, 4.0])
    counters = RetryCounters()
    counters.retries["http_429"] = 2
    text = timer.report(retries=counters).render()
    lines = text.splitlines()
    assert lines[0] == "run timing report: 4.0s since dispatch began, 2 of 2 started, 0 running"
    assert " ".join(lines[1].split()) == (
        "ok started within 60.0s of dispatch 100.0% (2 of 2) (healthy: >= 90.0%)"
    )
    assert lines[6] == (
        "  latency over 2 finished: median 3.0s | p90 3.8s | p99 4.0s | max 4.0s | "
        "task-hours 0.00 | drained 0"
    )
    assert lines[7] == "  retries 2 (waited 0.0s)"


# --- queue sampling -----------------------------------------------------------------------------


def metrics_client(answers: dict[str, tuple[int, str]]) -> httpx.AsyncClient:
    """A client whose servers answer from `answers` (host -> status, text); others fail."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host not in answers:
            raise httpx.ConnectError("refused", request=request)
        status, text = answers[request.url.host]
        return httpx.Response(status, text=text)

    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


URLS = ["http://a/metrics", "http://b/metrics", "http://c/metrics", "http://d/metrics"]
ANSWERS = {
    "a": (200, "vllm:num_requests_waiting 4\nvllm:num_requests_running 2\n"),
    "b": (200, "vllm:num_requests_waiting 1\nvllm:num_requests_running 6\n"),
    "c": (500, "oops"),
}


async def test_sample_queues_sums_over_servers() -> None:
    """Gauges are summed over servers that answered; the others count as errors."""
    async with metrics_client(ANSWERS) as client:
        sample = await sample_queues(client, URLS)
    assert (sample.waiting, sample.running, sample.servers, sample.errors) == (5.0, 8.0, 2, 2)


async def test_queue_sampler_samples_every_interval(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The sampler takes one round per interval, at exact virtual times, until cancelled."""
    timer = RunTimer()
    async with metrics_client(ANSWERS) as client, trio.open_nursery() as nursery:
        await nursery.start(timer.run_queue_sampler, client, URLS, 10.0)
        await trio.sleep(35.0)
        nursery.cancel_scope.cancel()
    assert [s.at for s in timer.samples] == [0.0, 10.0, 20.0, 30.0]
    assert {(s.waiting, s.running) for s in timer.samples} == {(5.0, 8.0)}


async def test_summaries_are_emitted_every_interval(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """run_summaries emits the rendered report once per interval."""
    timer = RunTimer()
    emitted: list[tuple[float, str]] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(
            timer.run_summaries, lambda text: emitted.append((trio.current_time(), text)), 60.0
        )
        await trio.sleep(150.0)
        nursery.cancel_scope.cancel()
    assert [t for t, _ in emitted] == [60.0, 120.0]
    assert all(text.startswith("run timing report") for _, text in emitted)


def test_timer_uses_the_outcome_elapsed_when_start_was_not_seen() -> None:
    """An outcome whose start was not recorded counts with its own elapsed time, if any."""
    timer = RunTimer.from_config(RunConfig(long_rollout_s=1.0), expected=3)
    timer.finished(Landed(ident(1), 0, {}, elapsed_seconds=2.5))
    timer.finished(Landed(ident(2), 0, {}, elapsed_seconds=None))
    summary = timer.latency()
    assert (summary.finished, summary.max_s) == (1, 2.5)
    assert timer.bounds.long_rollout_s == 1.0


def test_timer_rows_before_anything_finished() -> None:
    """With bounds set but nothing finished, rows say so without a verdict."""
    bounds = TimingBounds(
        rollout_timeout_s=5.0, long_rollout_s=5.0, dispatch_start_report_within_s=60.0
    )
    rows = RunTimer(bounds, expected=0, clock=lambda: 0.0).report().rows
    assert [(row.value, row.ok) for row in rows] == [
        ("no rollouts", None),
        ("none started yet", None),
        ("none finished yet", None),
        ("none finished yet", None),
        ("not sampled", None),
    ]


def test_parse_vllm_queue_skips_malformed_values() -> None:
    """A series whose value does not parse is skipped, the others summed."""
    text = 'vllm:num_requests_waiting{a="1"} NaNx\nvllm:num_requests_waiting 2\n'
    assert parse_vllm_queue(text + "vllm:num_requests_running 1\n") == (2.0, 1.0)
