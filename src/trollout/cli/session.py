"""The command line's run: the run layer's `collect` with a console and the signal watcher.

`collect_run` is `trollout.run.collect` as ``trollout collect`` runs it: progress and lines on
a stream through `progress.ConsoleObserver` (rich, live on a terminal), and SIGINT/SIGTERM
watched (`trollout.run.signals.watch_signals`: the first winds the run down, a second SIGINT
cancels). Everything else (the steps, their order, the watchers beside the engine) is the run
layer's; this module only chooses how a run shows itself and ends on a signal.
"""

from __future__ import annotations

from typing import IO

from ..collector.deployment.discovery import Deployment
from ..collector.http.transport import PostTransport
from ..recovery.resume import Resubmit
from ..run.compose import RunResult, collect
from ..run.session import StopWhen
from ..run.signals import watch_signals
from ..settings import RunConfig
from .progress import ConsoleObserver

__all__ = ["collect_run"]


async def collect_run(
    config: RunConfig,
    *,
    deployment: Deployment | None = None,
    progress_stream: IO[str] | None = None,
    live: bool | None = None,
    transport: PostTransport | None = None,
    resubmit: Resubmit | None = None,
    stop_when: StopWhen | None = None,
    prometheus: bool = True,
) -> RunResult:
    """Collect a run as the command line does (`trollout.run.collect`, with a console).

    Args:
        progress_stream: where progress lines go (stderr when None).
        live: force the live display on or off (None: decide by terminal).
        The others: as `trollout.run.collect`'s.

    Raises:
        TrolloutError: as `trollout.run.collect`.

    Cancellation: as `trollout.run.collect`'s.
    """
    return await collect(
        config,
        deployment=deployment,
        observer=ConsoleObserver(progress_stream, live),
        watchers=(watch_signals,),
        transport=transport,
        resubmit=resubmit,
        stop_when=stop_when,
        prometheus=prometheus,
    )
