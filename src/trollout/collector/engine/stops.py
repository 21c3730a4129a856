"""Run-level stops: conditions under which no retry can save the run.

A failed rollout is data, and the run goes on. A few patterns mean every further rollout will
fail the same way, and going on only burns time, quota and the producer's patience:

- ``--fail-fast``: the user asked to stop at the first failure (NeMo Gym's old default).
- credentials rejected: ``stop_after_auth_failures`` consecutive rollouts of one server with
  no success in between were refused for their credentials: the server answered 401 or 403,
  or said its provider (a sandbox, a grading API) refused them with the failure kind
  ``credentials_rejected``, on a producer's failure row, an episode ``failure``, a masked
  result, or the report a failed ``/run`` forwards in its headers (`classify.reports`).
- quota exhausted: a 429 or 403 whose body says the quota is exhausted
  (``insufficient_quota``, ``quota exceeded``), or a rollout whose failure kind is
  ``quota_exhausted`` (read as above): waiting out ``Retry-After`` will not help; the first
  one stops the run.

The two provider stops are NeMo Gym's (its ``_credentials_rejected_stop`` and
``_quota_exhausted_stop``): no attempt succeeds until the credentials are fixed or the quota
resets, so going on only spends every rollout's attempts. They are this one mechanism's rules,
not a second path: a failure kind counts where a status did, in the same per-server streak.
NeMo Gym's page names no threshold for them; trollout keeps its own (the streak of
``stop_after_auth_failures``, the first quota refusal) and its exit code for a stopped run, 1.
- an endpoint down (``on_endpoint_outage=stop``, the default): a rollout ended
  ``endpoint_down`` because its endpoint gave no answer for the outage grace
  (``dispatch_connect_grace_s``; `retry` decides that, once per endpoint and time, not per
  rollout). A dead agent in a 10,000-rollout eval would otherwise turn every remaining rollout
  into a failure row within seconds: a run that ends "complete" with nothing learned, whose
  failures each need a resume anyway. Stopping says it once, in one line naming the endpoint and
  how long it was silent, exits 1, and leaves the folder resumable when the server is back.
  ``on_endpoint_outage=fail`` fails those rollouts instead and goes on with the others (several
  agents, one of them gone, and the rest worth finishing).
- protocol violations: ``environment_protocol_violation_stop_after`` consecutive replies of the
  wrong shape from one server with no good answer (the producer is wrong). A good answer is one
  the collector can use: a landed result, or a well-formed episode ``failure``. Replies that
  are no answer to the episode (transport errors, non-200 statuses) and omitted attempts
  neither count nor reset the streak. "Consecutive" is in settle order, the order the single
  writer sees outcomes in, so the stop fires on exactly the N-th violation settled in a row.

`RunStops.check` looks at one settled outcome and returns the reason to stop, or None. The
engine calls it from its single writer, so it needs no lock. Streaks are counted per server
(the environment server, else the agent): one broken provider stops the run, a flaky one does
not, because any good answer resets its streak. Every stop is resumable: the run exits 1
(`RunStoppedError`) and resume re-runs what did not land.
"""

from __future__ import annotations

from collections import Counter
from typing import Final

from ...records import FAILURE_KIND, Failed, FailureClass, Landed, Outcome
from ...settings import OutagePolicy, RunConfig
from ..classify.episodes import EPISODE_FAILURE
from ..dispatch.retry import ENDPOINT_DOWN

__all__ = ["RunStops"]

_AUTH_STATUSES = frozenset({401, 403})
_QUOTA_MARKERS = (
    "insufficient_quota",
    "quota exceeded",
    "quota_exceeded",
    "exceeded your current quota",
)


CREDENTIALS_REJECTED: Final = "credentials_rejected"
QUOTA_EXHAUSTED: Final = "quota_exhausted"


class RunStops:
    """Watches settled outcomes for run-level stop conditions."""

    def __init__(self, config: RunConfig) -> None:
        self.fail_fast = config.fail_fast
        self.max_auth_failures = config.stop_after_auth_failures
        self.max_violations = config.environment_protocol_violation_stop_after
        self.stop_on_outage = config.on_endpoint_outage is OutagePolicy.STOP
        self._auth: Counter[str] = Counter()
        self._violations: Counter[str] = Counter()

    def check(self, outcome: Outcome) -> str | None:
        """Return why the run must stop after this outcome, or None."""
        if type(outcome) is Landed:
            kind = _masked_kind(outcome)
            if kind is not None:  # a masked result saying its provider refused: no success
                return self._provider(outcome, kind, _server_of(outcome))
            if self._auth or self._violations:  # a streak is running somewhere: end this one's
                server = _server_of(outcome)
                self._auth.pop(server, None)
                self._violations.pop(server, None)
            return None
        if type(outcome) is not Failed or outcome.no_persist:
            return None
        server = _server_of(outcome)
        if outcome.identity.task_id is not None and outcome.exception_type == EPISODE_FAILURE:
            self._violations.pop(server, None)  # a well-formed failure is a usable answer
        return (
            self._fail_fast(outcome)
            or self._outage(outcome)
            or self._quota(outcome, server)
            or self._credentials(outcome, server)
            or self._violation(outcome, server)
        )

    def _fail_fast(self, failed: Failed) -> str | None:
        if not self.fail_fast:
            return None
        return (
            f"--fail-fast: rollout {failed.identity.key} failed "
            f"({failed.failure_class}: {failed.message})"
        )

    def _outage(self, failed: Failed) -> str | None:
        if not self.stop_on_outage or failed.kind != ENDPOINT_DOWN:
            return None
        return (
            f"{_server_of(failed)!r} is down: {failed.message}; the run stopped: bring it back, "
            "then resume (or pass +on_endpoint_outage=fail to fail its rollouts and go on)"
        )

    def _quota(self, failed: Failed, server: str) -> str | None:
        if failed.kind == QUOTA_EXHAUSTED:
            return self._quota_stop(server, f"failure kind {QUOTA_EXHAUSTED}")
        if failed.http_status not in {429, 403}:
            return None
        body = (failed.response_body or "").lower()
        if not any(marker in body for marker in _QUOTA_MARKERS):
            return None
        return self._quota_stop(server, f"HTTP {failed.http_status}: {body[:120]!r}")

    @staticmethod
    def _quota_stop(server: str, what: str) -> str:
        return (
            f"quota exhausted at {server!r} ({what}); raise the quota or switch the key, then "
            "resume the run"
        )

    def _credentials(self, failed: Failed, server: str) -> str | None:
        if failed.kind == CREDENTIALS_REJECTED:
            return self._refused(server, f"failure kind {CREDENTIALS_REJECTED}")
        if failed.http_status not in _AUTH_STATUSES:
            return None
        return self._refused(server, f"HTTP {failed.http_status}")

    def _provider(self, outcome: Landed, kind: str, server: str) -> str | None:
        """A masked result's provider refusal: the stop its kind names (`_masked_kind`)."""
        what = f"failure kind {kind}"
        return (
            self._quota_stop(server, what)
            if kind == QUOTA_EXHAUSTED
            else self._refused(server, what)
        )

    def _refused(self, server: str, what: str) -> str | None:
        """Count one rollout refused for its credentials; the stop once the streak is long."""
        if self.max_auth_failures is None:
            return None
        self._auth[server] += 1
        if self._auth[server] < self.max_auth_failures:
            return None
        return (
            f"credentials rejected by {server!r}: {what} on {self._auth[server]} consecutive "
            "rollouts; fix the API key in the deployment, then resume the run"
        )

    def _violation(self, failed: Failed, server: str) -> str | None:
        if failed.failure_class != FailureClass.ENVIRONMENT_PROTOCOL_VIOLATION:
            return None
        if self.max_violations is None:
            return None
        self._violations[server] += 1
        if self._violations[server] < self.max_violations:
            return None
        return (
            f"{server!r} broke the environment protocol on {self._violations[server]} "
            f"consecutive rollouts (last: {failed.message}); fix the server, then resume"
        )


def _masked_kind(landed: Landed) -> str | None:
    """The provider refusal a landed (masked) result names in its ``failure_kind``, or None."""
    kind = landed.result.get(FAILURE_KIND)
    return kind if kind in (CREDENTIALS_REJECTED, QUOTA_EXHAUSTED) else None


def _server_of(outcome: Outcome) -> str:
    """The server whose streaks an outcome counts in: its environment server, else its agent."""
    return outcome.identity.environment_server or outcome.identity.agent_name or "?"
