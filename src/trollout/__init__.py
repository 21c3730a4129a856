"""trollout: a rollout collector for LLM agents and RL environments, on Trio.

The public API lives here; everything else may change. A command-line run plans rows, finds the
deployment, opens a run folder and a collector, and feeds the one to the other::

    deployment = await trollout.discover(client, "http://127.0.0.1:11000")
    plan = trollout.plan_rollouts("tasks.jsonl", config, deployment)
    async with trollout.open_run_folder(config, deployment, plan=plan) as run:
        resolve = deployment.run_url_resolver()
        async with trollout.open_collector(config=config, resolve=resolve, sink=run.store) as c:
            await c.collect(run.rows())

which is what ``trollout collect`` does, through the run layer (`trollout.run.collect`). A
training loop keeps one `Rollouts` across its steps and opens a batch per step::

    async with trollout.open_rollouts(urls, config=config, record_output_dir="runs/rl") as ro:
        async with ro.open_batch(ro.plan(rows), record_shard="step-0001") as batch:
            async for item in batch:          # item.row, item.outcome, item.run_id
                ...

`trollout.aio` and `trollout.sync` offer the same for asyncio and blocking callers.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .collector.deployment.discovery import Deployment, Route, discover
from .collector.engine.batch import Batch, BatchOutcome, shard_rollout_id
from .collector.engine.collector import Collector, open_collector, url_resolver
from .collector.engine.progress import Progress
from .collector.engine.sink import ListSink, OutcomeSink
from .collector.http.transport import Http11Transport, PostTransport, RawResponse
from .collector.planning.plan import Plan, plan_rollouts, plan_rows
from .errors import (
    ArgumentTypeError,
    ConfigError,
    DeploymentError,
    InputError,
    RunFolderError,
    RunFolderLockedError,
    RunFolderWriteError,
    RunStoppedError,
    TrolloutError,
    UnknownAgentError,
)
from .frontends.rollouts import Rollouts, open_rollouts
from .records import (
    BatchStatus,
    Delivery,
    Failed,
    FailureClass,
    Identity,
    Landed,
    MaterializedRow,
    OmitReason,
    Omitted,
    Outcome,
    RunManifest,
    outcome_from_row,
    outcome_to_row,
)
from .recovery.layout import RunLayout
from .recovery.run_folder import MaterializedRows, RunFolder, open_run_folder
from .recovery.store import RunStore, check_run_folder, open_run_store
from .settings import FsyncPolicy, RunConfig, SeedMode
from .settings import load_config as _load_settings

if TYPE_CHECKING:
    from . import aio, sync

_FRONT_ENDS = ("aio", "sync")


def load_config(
    *,
    config_file: str | os.PathLike[str] | None = None,
    options: Mapping[str, Any] | None = None,
    overrides: Iterable[str] = (),
    defaults: Mapping[str, Any] | None = None,
    saved: Mapping[str, Any] | None = None,
    labels: Mapping[str, str] | None = None,
) -> RunConfig:
    """Build a validated `RunConfig` from every source, as the command line does.

    `trollout.settings.load_config` (the command line's loader, without the notes it prints),
    then the health check ids checked, as ``trollout collect`` checks them: they are known to
    `trollout.health`, and settings, a leaf package, imports nothing of it.

    Args:
        config_file: a YAML file of settings (NeMo Gym key names; ``config_paths`` too).
        options: settings given as options (None values are left out).
        overrides: ``+key=value`` tokens.
        defaults: settings below all of these (a command's own defaults).
        saved: a resumed run's settings, below the options and overrides.
        labels: how each option is spelled, for messages.

    Raises:
        ConfigError: a file that cannot be read, an unknown key, a bad value or an unknown
            health check id, naming it.
    """
    config = _load_settings(
        config_file=config_file,
        options=options,
        overrides=overrides,
        defaults=defaults,
        saved=saved,
        labels=labels,
    )
    from .health.after import HealthSettings  # here: `import trollout` does not load health

    HealthSettings.of(config)
    return config


def __getattr__(name: str) -> Any:
    """Import the front ends `aio` and `sync` on first use.

    They are imported lazily so that the command line, which uses neither, does not pay for
    asyncio and the thread bridge at start-up (~0.1 s of CPU).
    """
    if name in _FRONT_ENDS:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ArgumentTypeError",
    "Batch",
    "BatchOutcome",
    "BatchStatus",
    "Collector",
    "ConfigError",
    "Delivery",
    "Deployment",
    "DeploymentError",
    "Failed",
    "FailureClass",
    "FsyncPolicy",
    "Http11Transport",
    "Identity",
    "InputError",
    "Landed",
    "ListSink",
    "MaterializedRow",
    "MaterializedRows",
    "OmitReason",
    "Omitted",
    "Outcome",
    "OutcomeSink",
    "Plan",
    "PostTransport",
    "Progress",
    "RawResponse",
    "Rollouts",
    "Route",
    "RunConfig",
    "RunFolder",
    "RunFolderError",
    "RunFolderLockedError",
    "RunFolderWriteError",
    "RunLayout",
    "RunManifest",
    "RunStoppedError",
    "RunStore",
    "SeedMode",
    "TrolloutError",
    "UnknownAgentError",
    "__version__",
    "aio",
    "check_run_folder",
    "discover",
    "load_config",
    "open_collector",
    "open_rollouts",
    "open_run_folder",
    "open_run_store",
    "outcome_from_row",
    "outcome_to_row",
    "plan_rollouts",
    "plan_rows",
    "shard_rollout_id",
    "sync",
    "url_resolver",
]
