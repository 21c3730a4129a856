"""The engine's one telemetry hook: an optional observer of attempts and outcomes.

Design note. Telemetry (traces, metrics; `trollout.telemetry`) watches the engine through this
narrow protocol and nothing else. The collector holds ``observer: Observer | None``, None by
default, so with telemetry off the hot path pays one ``is None`` test per attempt and per
settled batch, and no telemetry module is imported at all. What the engine already counts (in
flight, resident rollouts, breaker states, retry counters) is not pushed through the hook: an
observer reads it from the `Collector` when its metrics are collected, at no cost per rollout.

Rejected alternative: telemetry calls (spans, counters) written into the engine, dispatch and
transport where each event happens. They would tie the collector to OpenTelemetry, make "off"
a set of flags checked all over the hot path, and scatter one concern over five modules.

Every hook runs on the event loop's thread and must return at once: it may not block or
await. The collector wraps whatever observer it is given in `Guarded`, so a hook that raises
(a driver's own observer, say) is reported once and otherwise ignored: it can never fail a
rollout, replace a cancellation, or stop the writer. Header lines an observer returns are sent
only if each is one well-formed line ending in CRLF.
"""

from __future__ import annotations

import logging
import re
from typing import Protocol

import attrs

from ...records import Failed, Landed, MaterializedRow, Outcome
from ..dispatch.hooks import AttemptObserver, AttemptTrace

__all__ = ["AttemptTrace", "Guarded", "Observer"]  # AttemptTrace: from dispatch.hooks

_log = logging.getLogger(__name__)
# Header lines: a token name, a value of visible characters and blanks, CRLF; nothing else.
_HEADER_LINES = re.compile(rb"(?:[!#$%&'*+.^_`|~0-9A-Za-z-]+:[ \t]*[\x21-\x7e][\x20-\x7e]*\r\n)*")


class Observer(AttemptObserver, Protocol):
    """Watches one collector: attempts as they run (`AttemptObserver`, the hooks dispatch
    calls), outcomes as the writer settles them."""

    def outcome_settled(self, outcome: Outcome, final: bool) -> None:
        """Note one outcome the writer settled (`final`: the rollout's last in this run)."""
        ...


@attrs.define(slots=True)
class _NoTrace:
    """The trace of an attempt whose observer failed to start one: no header, nothing kept."""

    headers: bytes = b""


class Guarded:
    """An observer that never raises: each hook of the wrapped one, its errors reported once.

    Args:
        inner: the observer to call.
    """

    def __init__(self, inner: Observer) -> None:
        self.inner = inner
        self._reported = False

    def _failed(self, hook: str) -> None:
        if not self._reported:
            self._reported = True
            _log.warning("trollout: telemetry observer failed in %s; ignored", hook, exc_info=True)

    def attempt_started(self, row: MaterializedRow, attempt: int, url: str) -> AttemptTrace:
        """As `Observer.attempt_started`; a failure, or malformed headers, give no header."""
        try:
            trace = self.inner.attempt_started(row, attempt, url)
            headers = trace.headers
            if headers and _HEADER_LINES.fullmatch(headers) is None:
                raise ValueError(f"malformed trace header lines {headers[:200]!r}")
        except Exception:
            self._failed("attempt_started")
            return _NoTrace()
        return trace

    def retry_wait(self, trace: AttemptTrace, reason: str, delay_s: float) -> None:
        """As `Observer.retry_wait`."""
        if isinstance(trace, _NoTrace):
            return
        try:
            self.inner.retry_wait(trace, reason, delay_s)
        except Exception:
            self._failed("retry_wait")

    def attempt_ended(
        self, trace: AttemptTrace, outcome: Landed | Failed | None, retries: int
    ) -> None:
        """As `Observer.attempt_ended`."""
        if isinstance(trace, _NoTrace):
            return
        try:
            self.inner.attempt_ended(trace, outcome, retries)
        except Exception:
            self._failed("attempt_ended")

    def outcome_settled(self, outcome: Outcome, final: bool) -> None:
        """As `Observer.outcome_settled`."""
        try:
            self.inner.outcome_settled(outcome, final)
        except Exception:
            self._failed("outcome_settled")
