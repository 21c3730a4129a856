"""Hypothesis strategies for property tests of code that drives trollout.

Draw what the fake deployment does to each request, then check what your driver does with it::

    from hypothesis import given
    from trollout.testing import FaultScript, open_fake_deployment
    from trollout.testing.strategies import fault_scripts

    @given(script=fault_scripts(tasks=8))
    def test_every_rollout_settles_once(script):
        async def main():
            async with open_fake_deployment(fault_fn=FaultScript(entries=script)) as fake:
                ...  # run your training step against fake.run_urls, assert on the outcomes
        trio.run(main)

A script maps ``(run id, task, rollout, attempt, request)`` to a `Fault`; the request index
counts the requests of one attempt (a 429 or 503 is retried within its attempt, so request 1 of
attempt 0 is the retry of request 0). The same script drives the fake in its own process:
write it with `write_fault_script` to the file given to ``spawn_fake_deployment(fault_script=...)``.
examples/property_test.py is a complete test to copy.

Needs hypothesis (the ``testing`` extra: ``pip install 'trollout[testing]'``).
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

from .fault_scripts import ScriptKey
from .faults import Fault, FaultKind

__all__ = [
    "DEFAULT_KINDS",
    "attempt_sequences",
    "fault_scripts",
    "faults",
    "request_sequences",
]

DEFAULT_KINDS: tuple[FaultKind, ...] = (
    FaultKind.LATENCY,
    FaultKind.STATUS,
    FaultKind.RESET_MID_REQUEST,
    FaultKind.DISCONNECT,
    FaultKind.RESET_MID_RESPONSE,
    FaultKind.NOT_JSON,
    FaultKind.NO_PERSIST,
    FaultKind.FAILURE_CLASS,
)
"""Faults that end on their own: every request gets an answer, an error or a closed socket.
Add `FaultKind.HANG` (and bound your rollouts: ``rollout_timeout_s``, or an exit) to test hangs.
"""
_STATUSES = (429, 500, 502, 503)


def faults(
    *,
    kinds: Sequence[FaultKind] = DEFAULT_KINDS,
    max_delay_s: float = 0.05,
    max_retry_after_s: float = 0.05,
) -> st.SearchStrategy[Fault]:
    """Draw one fault of one of ``kinds``, its delays and ``Retry-After`` kept small."""
    delay = st.floats(0.0, max_delay_s, allow_nan=False)
    retry_after = st.none() | st.floats(0.0, max_retry_after_s, allow_nan=False)
    options = []
    for kind in kinds:
        if kind is FaultKind.STATUS:
            options.append(
                st.builds(
                    Fault,
                    kind=st.just(kind),
                    status=st.sampled_from(_STATUSES),
                    retry_after=retry_after,
                    delay_s=delay,
                )
            )
        elif kind is FaultKind.FAILURE_CLASS:
            options.append(
                st.builds(
                    Fault,
                    kind=st.just(kind),
                    failure_class=st.sampled_from(("transient", "timeout_exceeded")),
                    terminal=st.booleans(),
                )
            )
        else:
            options.append(st.builds(Fault, kind=st.just(kind), delay_s=delay))
    return st.one_of(options)


def request_sequences(
    *,
    max_requests: int = 3,
    kinds: Sequence[FaultKind] = DEFAULT_KINDS,
    max_delay_s: float = 0.05,
) -> st.SearchStrategy[list[Fault | None]]:
    """Draw what the successive requests of one attempt meet (None: answered normally)."""
    fault = faults(kinds=kinds, max_delay_s=max_delay_s, max_retry_after_s=max_delay_s)
    return st.lists(st.none() | fault, min_size=1, max_size=max_requests)


def attempt_sequences(
    *,
    max_attempts: int = 2,
    max_requests: int = 3,
    kinds: Sequence[FaultKind] = DEFAULT_KINDS,
    max_delay_s: float = 0.05,
) -> st.SearchStrategy[list[list[Fault | None]]]:
    """Draw `request_sequences` for a rollout's successive attempts."""
    attempt = request_sequences(max_requests=max_requests, kinds=kinds, max_delay_s=max_delay_s)
    return st.lists(attempt, min_size=1, max_size=max_attempts)


@st.composite
def fault_scripts(
    draw: st.DrawFn,
    *,
    tasks: int,
    rollouts: int = 1,
    max_attempts: int = 2,
    max_requests: int = 3,
    kinds: Sequence[FaultKind] = DEFAULT_KINDS,
    run_id: str | None = None,
    max_delay_s: float = 0.05,
) -> dict[ScriptKey, Fault]:
    """Draw a fault script for ``tasks`` x ``rollouts`` rollouts (``FaultScript(entries=...)``).

    Args:
        tasks: task indices 0 .. tasks - 1.
        rollouts: rollout indices 0 .. rollouts - 1 of each task.
        max_attempts: attempts scripted per rollout.
        max_requests: requests scripted per attempt.
        kinds: the fault kinds to draw from.
        run_id: limit the script to one batch's rollouts (its ``_ng_run_id``); None: any.
        max_delay_s: the longest extra delay and ``Retry-After`` drawn, in seconds.
    """
    script: dict[ScriptKey, Fault] = {}
    per_rollout = attempt_sequences(
        max_attempts=max_attempts, max_requests=max_requests, kinds=kinds, max_delay_s=max_delay_s
    )
    for task in range(tasks):
        for rollout in range(rollouts):
            for attempt, requests in enumerate(draw(per_rollout)):
                for request, fault in enumerate(requests):
                    if fault is not None:
                        script[(run_id, task, rollout, attempt, request)] = fault
    return script
