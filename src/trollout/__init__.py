"""trollout: a rollout collector for LLM agents and RL environments, on Trio.

The public API lives here; everything else may change. A driver plans rows, finds the
deployment, opens a run folder and a collector, and feeds the one to the other::

    deployment = await trollout.discover(client, "http://127.0.0.1:11000")
    plan = trollout.plan_rollouts("tasks.jsonl", config, deployment)
    async with trollout.open_run_store(layout, config, expected=plan.expected) as store:
        await store.write_materialized_inputs(plan.rows())
        resolve = deployment.run_url_resolver()
        async with trollout.open_collector(config=config, resolve=resolve, sink=store) as collector:
            await collector.collect(plan.rows())

which is exactly what ``trollout collect`` does (`trollout.cli.collect.collect_run`).
"""

from __future__ import annotations

from ._version import __version__
from .collector.deployment import Deployment, Route, discover
from .collector.engine import Collector, open_collector, url_resolver
from .collector.plan import Plan, plan_rollouts, plan_rows
from .collector.progress import Progress
from .collector.sink import ListSink, OutcomeSink
from .collector.transport import H11Transport, Http11Transport, PostTransport, RawResponse
from .config import FsyncPolicy, RunConfig, SeedMode, load_config
from .errors import (
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
from .recovery.store import RunStore, check_run_folder, open_run_store

__all__ = [
    "BatchStatus",
    "Collector",
    "ConfigError",
    "Delivery",
    "Deployment",
    "DeploymentError",
    "Failed",
    "FailureClass",
    "FsyncPolicy",
    "H11Transport",
    "Http11Transport",
    "Identity",
    "InputError",
    "Landed",
    "ListSink",
    "MaterializedRow",
    "OmitReason",
    "Omitted",
    "Outcome",
    "OutcomeSink",
    "Plan",
    "PostTransport",
    "Progress",
    "RawResponse",
    "Route",
    "RunConfig",
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
    "check_run_folder",
    "discover",
    "load_config",
    "open_collector",
    "open_run_store",
    "outcome_from_row",
    "outcome_to_row",
    "plan_rollouts",
    "plan_rows",
    "url_resolver",
]
