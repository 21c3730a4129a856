"""The command line's way with SIGINT and SIGTERM during a session, as an opt-in watcher.

The first SIGINT or SIGTERM stops admission at once and gives rollouts in flight ``grace_s``
seconds (`Session.wind_down`), then the rest are cancelled and settle as omitted, so the
folder is resumable; a second SIGINT cancels at once. On SIGTERM the timing report is shown
before winding down (a job scheduler's kill may follow soon). The session's ``signal`` records
the first, so the caller can exit 128 + it.

Opt-in (`collect`'s ``watchers``): the library never takes a process's signals by itself (an
embedding driver owns them). The command line and a Ray block (whose worker a node drain or a
preemption signals) pass it. Signals are only watched on the main thread (Trio's rule);
elsewhere this watcher does nothing.
"""

from __future__ import annotations

import signal
import threading
from functools import partial

import trio

from .session import Session, timing_report

__all__ = ["watch_signals"]


async def watch_signals(session: Session) -> None:
    """Watch SIGINT and SIGTERM for the session (module docstring).

    Cancellation: this is how it ends, when the session's rows have settled.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    collector, grace_s = session.collector, session.config.grace_s
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            async for signum in signals:
                name = signal.Signals(signum).name
                if session.signal is None:
                    session.signal = signum
                    session.message(
                        f"trollout: {name}: starting no new rollout; {grace_s:g} s for the rest "
                        "to finish (SIGINT again to stop at once)"
                    )
                    if signum == signal.SIGTERM:
                        session.message(timing_report(collector))
                    nursery.start_soon(partial(session.wind_down, f"received {name}"))
                elif signum == signal.SIGINT:
                    session.message("trollout: second SIGINT: cancelling the rollouts in flight")
                    collector.cancel_in_flight("received a second SIGINT")
