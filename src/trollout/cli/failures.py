"""How the command line ends: exit codes, one-line errors, Trio runs that turn errors into codes.

Exit codes (docs/style.md): 0 done; 1 a failed or stopped run; 2 a usage error (bad option, bad
input row, unknown agent: one line on stderr, nothing dispatched, nothing written); 75/76 an
incomplete run under ``require_complete``; 130 SIGINT; 143 SIGTERM. A user mistake never prints
a traceback.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

import click
import trio

from ..errors import (
    ConfigError,
    DeploymentError,
    IncompleteEvaluationError,
    RunFolderError,
    RunStoppedError,
    TrolloutError,
)
from ..text import visible

__all__ = [
    "EXIT_FAILED",
    "EXIT_INCOMPLETE_FINAL",
    "EXIT_INCOMPLETE_RETRYABLE",
    "EXIT_USAGE",
    "fail",
    "report_errors",
    "run_trio",
]

EXIT_USAGE = 2
EXIT_FAILED = 1
EXIT_INCOMPLETE_RETRYABLE = 75  # require_complete, and a resume would dispatch more
EXIT_INCOMPLETE_FINAL = 76  # require_complete, and nothing left can be retried


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``code``.

    Messages quote files and servers, so control characters are shown escaped (`visible`).
    """
    click.echo(f"trollout: error: {visible(message)}", err=True)
    sys.exit(code)


def run_trio(fn: Callable[..., Any], *args: Any) -> Any:
    """Run an async function under Trio, turning trollout's errors into exit codes.

    Nurseries may wrap an error in exception groups; when every leaf is one of ours, each is
    reported on its own line and the exit code is the most severe one's.

    Signals: a dispatch session watches SIGINT and SIGTERM itself (`session`). Outside it
    (discovery, planning, writing the materialized inputs, aggregation) SIGINT interrupts at
    once, as Trio delivers KeyboardInterrupt, and so does SIGTERM (`_SigtermInterrupts`), which
    works whatever SIGINT's disposition (a job started with ``&`` by a script ignores SIGINT);
    both leave the folder as it was or resumable, and exit 130 or 143.
    """
    sigterm = _SigtermInterrupts()
    try:
        return trio.run(sigterm.run, fn, *args)
    except KeyboardInterrupt:
        _interrupted(sigterm.received)
    except TrolloutError as exc:
        report_errors([exc])
    except BaseExceptionGroup as group:
        if group.subgroup(KeyboardInterrupt) is not None:  # raised in a nursery's child task
            _interrupted(sigterm.received)
        leaves = list(_leaves(group))
        if not all(isinstance(leaf, TrolloutError) for leaf in leaves):
            raise
        report_errors(leaves)


def _interrupted(signum: int | None) -> NoReturn:
    name = signal.Signals(signum or signal.SIGINT).name
    click.echo(f"trollout: {name}: stopped; the run folder is kept as it was", err=True)
    sys.exit(128 + (signum or signal.SIGINT))


class _SigtermInterrupts:
    """Make SIGTERM interrupt a Trio run as SIGINT does, without relying on SIGINT at all.

    The handler does what Trio's own SIGINT handler does: in code outside Trio's machinery
    (planning's loops, say) it raises KeyboardInterrupt at once; where Trio is protected from
    KeyboardInterrupt (its scheduler, a task waiting for a worker thread), it cancels the run,
    and the run then ends in KeyboardInterrupt. Either way the code in the run unwinds as on a
    Ctrl-C, so what is written stays whole. Only on the main thread (Python's rule for
    handlers); a session's own signal watcher takes precedence while it is open, and the
    previous handler is restored when the run ends.

    Design note: turning SIGTERM into ``raise_signal(SIGINT)`` was rejected: a process that
    ignores SIGINT (``cmd &`` in a script without job control, a common batch-job pattern)
    gets no SIGINT handler from Trio, so the re-raised signal was dropped and SIGTERM lost.
    """

    def __init__(self) -> None:
        """Start with no signal received."""
        self.received: int | None = None

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` with SIGTERM interrupting it.

        Cancellation: as ``fn``'s; a SIGTERM ends it in KeyboardInterrupt.
        """
        if threading.current_thread() is not threading.main_thread():
            return await fn(*args)
        token = trio.lowlevel.current_trio_token()
        result = None
        with trio.CancelScope() as scope:

            def interrupt(signum: int, frame: object) -> None:
                self.received = signum
                if not trio.lowlevel.currently_ki_protected():
                    raise KeyboardInterrupt
                token.run_sync_soon(scope.cancel, "received SIGTERM")  # signal-safe

            previous = signal.signal(signal.SIGTERM, interrupt)
            try:
                result = await fn(*args)
            finally:
                signal.signal(signal.SIGTERM, previous)
        if self.received is not None:
            raise KeyboardInterrupt
        return result


def report_errors(errors: Sequence[BaseException]) -> NoReturn:
    """Print each error on its own line and exit with the most severe code among them."""
    codes = {_exit_code(error) for error in errors}
    for error in errors:
        prefix = "run stopped: " if isinstance(error, RunStoppedError) else ""
        click.echo(f"trollout: error: {prefix}{visible(str(error))}", err=True)
    sys.exit(next(code for code in _SEVERITY if code in codes))


# When several errors end a run, the exit code is the first of these that applies.
_SEVERITY = (EXIT_FAILED, EXIT_INCOMPLETE_FINAL, EXIT_INCOMPLETE_RETRYABLE, EXIT_USAGE)


def _exit_code(error: BaseException) -> int:
    if isinstance(error, RunStoppedError):  # a RunFolderWriteError is both: the run stopped
        return EXIT_FAILED
    if isinstance(error, ConfigError | DeploymentError | RunFolderError):
        return EXIT_USAGE
    if isinstance(error, IncompleteEvaluationError):
        return EXIT_INCOMPLETE_RETRYABLE if error.retryable else EXIT_INCOMPLETE_FINAL
    return EXIT_FAILED


def _leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[BaseException]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc
