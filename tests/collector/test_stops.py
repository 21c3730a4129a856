"""Run-level stops: the conditions that end a run no retry can save."""

from __future__ import annotations

import builders
from trollout.collector.stops import RunStops
from trollout.config import RunConfig
from trollout.records import Failed, FailureClass, Landed


def failed(status: int | None = 500, body: str = "", server: str = "env", **kw: object) -> Failed:
    """A failed attempt from `server`."""
    return builders.failed(0, env=server, http_status=status, response_body=body, **kw)


def landed(server: str = "env") -> Landed:
    """A landed attempt from `server`."""
    return builders.landed(0, env=server, result={"reward": 1})


def test_stops_credentials_after_consecutive_auth_failures() -> None:
    """401/403 on N consecutive rollouts of one server stops the run, naming the server."""
    stops = RunStops(RunConfig(stop_after_auth_failures=3))
    assert stops.check(failed(401)) is None
    assert stops.check(failed(403)) is None
    reason = stops.check(failed(401))
    assert reason is not None
    assert "credentials rejected by 'env'" in reason


def test_stops_auth_streak_resets_on_success_and_is_per_server() -> None:
    """A landed rollout resets the streak; another server's failures do not add to it."""
    stops = RunStops(RunConfig(stop_after_auth_failures=2))
    assert stops.check(failed(401)) is None
    assert stops.check(landed()) is None
    assert stops.check(failed(401)) is None
    assert stops.check(failed(401, server="other")) is None


def test_stops_quota_exhausted_at_once() -> None:
    """A 429 saying the quota is exhausted stops the run on the first occurrence."""
    stops = RunStops(RunConfig())
    assert stops.check(failed(429, body="slow down")) is None
    reason = stops.check(failed(429, body='{"error": {"code": "insufficient_quota"}}'))
    assert reason is not None
    assert "quota exhausted" in reason


def test_stops_protocol_violations_after_threshold() -> None:
    """Consecutive protocol violations from one server stop the run."""
    stops = RunStops(RunConfig(environment_protocol_violation_stop_after=2))
    violation = FailureClass.ENVIRONMENT_PROTOCOL_VIOLATION.value
    assert stops.check(failed(200, failure_class=violation, message="list")) is None
    reason = stops.check(failed(200, failure_class=violation, message="list"))
    assert reason is not None
    assert "broke the environment protocol" in reason


def test_stops_ignore_ordinary_failures_and_kill_shaped() -> None:
    """Ordinary failures and kill-shaped replies never stop a run."""
    stops = RunStops(RunConfig(stop_after_auth_failures=1))
    assert stops.check(failed(500)) is None
    assert stops.check(failed(401, no_persist=True)) is None
