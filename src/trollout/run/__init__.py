"""The run layer: one composition of a run, used by every entry point.

A run is always the same steps, in this order (`compose.collect`, whose body is the list):

1. check everything that needs neither the deployment nor a write (`checks.check_before_writing`);
2. find the deployment (`deployment.load_deployment`: ``--agent-url``s, else the head server);
3. plan the input and refuse bad rows, a full disk or a batch manifest that does not match,
   before a file is touched (`checks`);
4. open (or resume) the run folder (`recovery.run_folder.open_run_folder`) and start telemetry;
5. run the engine with its watchers (`session.run_session`: housekeeping, the deadline, timing
   summaries, the queue sampler, the caller's watchers and progress observer);
6. refuse an incomplete run under ``require_complete``, then aggregate (`checks`, `metrics`).

The health check and the enrichment pass join this list when they land: each is one more step
in `compose.collect`, between 5 and 6 (health, enrichment), and nothing else changes.

Who calls it: the command line (`trollout.cli`: parsing and printing around these functions),
the Ray blocks (`trollout.scaleout.ray.block`), a Slurm job (which is ``trollout collect``), an
embedding driver, and the front ends' shard recording (`shards`, which opens a folder per
batch through the same `open_run_folder`). The library API:

- `collect(config) -> RunResult`: a fresh run, or a resume with ``resume_from_cache``;
- `resume(run)` / `resubmit(run, classes=...)`: continue a run with its saved settings;
- `status(run) -> RunStatus`: where a run (or a distributed run's shards) stands, read-only.

Progress goes through a `RunObserver` the caller supplies (`observe`): lines for people
(warnings, notes, periodic timing summaries) and a watch task given a `RunView` of the
engine's counters. The command line's observer draws them with rich; the library default
prints lines on stderr and draws nothing. Signals are not handled here by default: Trio
watches signals only on the main thread, and an embedding driver owns its process's; an entry
point that wants the command line's behaviour (first SIGINT/SIGTERM winds down, a second
SIGINT cancels) passes `signals.watch_signals` as a watcher, as the CLI and a Ray block do.

Design notes. The run was composed inside the CLI (``cli/collect.py``), so the Ray blocks had
to import the command line and the front ends composed planning and folders a second way; now
the CLI is parsing and printing and every composition lives here. Rejected: a ``Run`` class
with a method per step (an object whose only use is to be called once, in order; the step list
is easier to read and extend as one function); putting the signal watcher in the CLI only
(a Ray block is an entry point with the same need and must not import the CLI, so the watcher
is an opt-in piece of this layer instead); and making Ray one more branch of `collect` (the
layering keeps Ray behind the command line's lazy import, so `trollout.cli.scaleout` chooses
between `collect` and `trollout.scaleout.ray.driver`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .compose import RunResult, collect
    from .deployment import http_client, load_deployment
    from .observe import RunObserver, RunView, Snapshot, StreamObserver
    from .resumption import resubmit, resume, saved_settings
    from .session import Session, Watcher
    from .signals import watch_signals
    from .state import RunStatus, status

# Each public name, and the module of this package that defines it. They are loaded on first
# use: the front ends import `shards` alone (so ``import trollout`` does not load the metrics,
# the settings table and the rest, ~40 ms), while ``from trollout import run; run.collect``
# reads as if they were imported here. The modules are not named after the functions
# (`compose` holds `collect`, `state` holds `status`, `resumption` holds `resume`): a
# submodule, once imported, is an attribute of the package and would hide the function.
_WHERE = {
    "RunObserver": "observe",
    "RunResult": "compose",
    "RunStatus": "state",
    "RunView": "observe",
    "Session": "session",
    "Snapshot": "observe",
    "StreamObserver": "observe",
    "Watcher": "session",
    "collect": "compose",
    "http_client": "deployment",
    "load_deployment": "deployment",
    "resubmit": "resumption",
    "resume": "resumption",
    "saved_settings": "resumption",
    "status": "state",
    "watch_signals": "signals",
}


def __getattr__(name: str) -> Any:
    """Load a public name's module on first use (see `_WHERE`)."""
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "RunObserver",
    "RunResult",
    "RunStatus",
    "RunView",
    "Session",
    "Snapshot",
    "StreamObserver",
    "Watcher",
    "collect",
    "http_client",
    "load_deployment",
    "resubmit",
    "resume",
    "saved_settings",
    "status",
    "watch_signals",
]
