"""Run-level stops: the conditions that end a run no retry can save."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

import builders
from trollout.collector.engine.stops import RunStops
from trollout.records import Failed, FailureClass, Identity, Landed
from trollout.settings import RunConfig


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


# --- the episode violation stop (docs/protocol.md section 3) ----------------------------------

TASK_ID = {"taskset": "t", "task_id": "1"}
VIOLATION = FailureClass.ENVIRONMENT_PROTOCOL_VIOLATION.value


def episode_identity(server: str = "env") -> Identity:
    """The identity of a task row routed to `server`."""
    return Identity(0, 0, environment_server=server, task_id=TASK_ID)


def violated(server: str = "env") -> Failed:
    """A protocol violation from `server`."""
    return Failed(episode_identity(server), 0, VIOLATION, kind=VIOLATION, http_status=200)


def episode_failure(server: str = "env", *, terminal: bool = False) -> Failed:
    """A well-formed episode failure from `server` (a usable reply)."""
    return Failed(
        episode_identity(server),
        0,
        "environment_server_failed",
        terminal=terminal,
        exception_type="EpisodeFailure",
        http_status=200,
    )


def test_stops_violation_fires_at_exactly_the_nth_consecutive() -> None:
    """N-1 violations leave the run going; the N-th stops it, naming the server and count."""
    stops = RunStops(RunConfig(environment_protocol_violation_stop_after=3))
    assert stops.check(violated()) is None
    assert stops.check(violated()) is None
    reason = stops.check(violated())
    assert reason is not None
    assert "'env' broke the environment protocol on 3 consecutive rollouts" in reason


def test_stops_well_formed_episode_failure_resets_the_violation_streak() -> None:
    """A usable failure (terminal or not) is a good answer: the streak starts over."""
    stops = RunStops(RunConfig(environment_protocol_violation_stop_after=2))
    for usable in (
        episode_failure(),
        episode_failure(terminal=True),
        builders.landed(0, env="env"),
    ):
        assert stops.check(violated()) is None
        assert stops.check(usable) is None
    assert stops.check(violated()) is None
    assert stops.check(violated()) is not None


def test_stops_transport_errors_and_omitted_neither_count_nor_reset() -> None:
    """Non-200s, no-reply failures and omitted attempts leave the streak where it was."""
    stops = RunStops(RunConfig(environment_protocol_violation_stop_after=3))
    others = [
        Failed(episode_identity(), 0, "agent_run_error", http_status=500),
        Failed(episode_identity(), 0, "agent_request_failed", http_status=None),
        Failed(episode_identity(), 0, "agent_run_error", kind="malformed_body", http_status=200),
        builders.omitted(0),
    ]
    assert stops.check(violated()) is None
    for other in others:
        assert stops.check(other) is None
    assert stops.check(violated()) is None
    for other in others:
        assert stops.check(other) is None
    assert stops.check(violated()) is not None


def test_stops_flat_failure_claiming_episode_type_does_not_reset() -> None:
    """Only an episode's own failure resets: a flat reply cannot forge one by its type name."""
    stops = RunStops(RunConfig(environment_protocol_violation_stop_after=2))
    forged = builders.failed(0, env="env", exception_type="EpisodeFailure", http_status=200)
    assert stops.check(violated()) is None
    assert stops.check(forged) is None
    assert stops.check(violated()) is not None


def test_stops_violation_streaks_are_per_server_and_can_be_off() -> None:
    """Another server's violations do not add up; None disables the stop."""
    stops = RunStops(RunConfig(environment_protocol_violation_stop_after=2))
    assert stops.check(violated("a")) is None
    assert stops.check(violated("b")) is None
    off = RunStops(RunConfig(environment_protocol_violation_stop_after=None))
    assert all(off.check(violated()) is None for _ in range(50))


KINDS = st.sampled_from(["violation", "landed", "failure", "transport", "omitted"])


@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), KINDS), max_size=40), st.integers(1, 5))
def test_stops_violation_stop_follows_the_rule_for_any_sequence(
    sequence: list[tuple[str, str]], limit: int
) -> None:
    """The stop fires first at the outcome where a server's run of violations, counting only
    violations and usable answers, first reaches the limit; never earlier."""
    make = {
        "violation": violated,
        "landed": lambda s: builders.landed(0, env=s),
        "failure": episode_failure,
        "transport": lambda s: Failed(episode_identity(s), 0, "agent_run_error", http_status=500),
        "omitted": lambda s: builders.omitted(0),
    }
    stops = RunStops(RunConfig(environment_protocol_violation_stop_after=limit))
    streak = {"a": 0, "b": 0}
    expected = None
    for i, (server, kind) in enumerate(sequence):
        if kind == "violation":
            streak[server] += 1
        elif kind in ("landed", "failure"):
            streak[server] = 0
        if streak[server] >= limit and expected is None:
            expected = i
    fired = next(
        (i for i, (s, k) in enumerate(sequence) if stops.check(make[k](s)) is not None), None
    )
    assert fired == expected


# --- a provider's refusal named by a failure kind (issue 25: NeMo Gym's provider stops) ------


def test_stops_credentials_rejected_failure_kind_counts_as_an_auth_failure() -> None:
    """A producer's failure row of kind credentials_rejected counts in the same per-server
    streak as a 401/403, and the stop names the kind."""
    stops = RunStops(RunConfig(stop_after_auth_failures=3))
    refused = {"failure_class": "agent_run_error", "kind": "credentials_rejected"}
    assert stops.check(failed(200, **refused)) is None
    assert stops.check(failed(401)) is None
    reason = stops.check(failed(500, **refused))
    assert reason is not None
    assert "credentials rejected by 'env': failure kind credentials_rejected on 3" in reason


def test_stops_quota_exhausted_failure_kind_stops_at_once() -> None:
    """A rollout whose failure kind is quota_exhausted stops the run on the first one."""
    stops = RunStops(RunConfig())
    reason = stops.check(failed(200, kind="quota_exhausted"))
    assert reason is not None
    assert "quota exhausted at 'env' (failure kind quota_exhausted)" in reason


def test_stops_a_masked_result_naming_a_refusal_is_no_success() -> None:
    """A landed masked result whose failure_kind says credentials_rejected neither resets the
    streak nor passes: it counts; one saying quota_exhausted stops the run."""
    stops = RunStops(RunConfig(stop_after_auth_failures=2))
    masked = builders.landed(
        0, env="env", result={"mask_sample": True, "failure_kind": "credentials_rejected"}
    )
    assert stops.check(failed(401)) is None
    assert stops.check(masked) is not None
    quota = builders.landed(0, env="env", result={"failure_kind": "quota_exhausted"})
    assert RunStops(RunConfig()).check(quota) is not None
