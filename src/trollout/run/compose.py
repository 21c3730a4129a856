"""`collect`: one run, composed once (the step list of the run layer, `trollout.run`).

The order is the contract (docs/design.md, Durability): everything that can refuse the run
(config, deployment discovery, every input row, the folder's preflight checks, free space) is
checked before a single file is touched; then `recovery.run_folder.open_run_folder` locks the
folder and either starts the run (materialized inputs, then the manifest, both fsynced) or
resumes it (the manifest checked, what is not done decided); only then does the first rollout go
out, its attempt number already in the ledger.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING

import attrs
import trio

from ..collector.deployment.discovery import Deployment
from ..collector.engine.progress import Progress
from ..collector.http.transport import PostTransport
from ..errors import ConfigError
from ..metrics import AggregateResult
from ..recovery.layout import RunLayout
from ..recovery.manifest import FolderState, folder_state
from ..recovery.resume import Resubmit, RunTally
from ..recovery.run_folder import open_run_folder
from ..settings import RunConfig, differences
from ..telemetry import TelemetrySettings
from . import checks
from .deployment import load_deployment
from .health import after_run
from .observe import RunObserver, StreamObserver, line_stream
from .session import StopWhen, Watcher, run_session, stop_when_watcher, timing_report

if TYPE_CHECKING:
    from ..telemetry.runtime import Telemetry

__all__ = ["RunResult", "collect"]


@attrs.frozen
class RunResult:
    """What a finished collection run reports."""

    layout: RunLayout
    expected: int
    progress: Progress
    elapsed_s: float
    max_resident: int
    resumed: RunTally | None = None
    timing: str = ""
    signal: int | None = None
    deadline_reached: bool = False
    aggregate: AggregateResult | None = None
    health: tuple[str, ...] = ()  # the rollout health lines (`health.after_run`)
    differences: tuple[str, ...] = ()
    stopped: str | None = None
    # The run's telemetry, ended: its Prometheus endpoint (if any) serves the final values
    # until the entry point calls `Telemetry.linger` last, after printing (telemetry/runtime.py).
    telemetry: Telemetry | None = attrs.field(default=None, eq=False, repr=False)


async def collect(
    config: RunConfig,
    *,
    deployment: Deployment | None = None,
    observer: RunObserver | None = None,
    watchers: Sequence[Watcher] = (),
    transport: PostTransport | None = None,
    resubmit: Resubmit | None = None,
    stop_when: StopWhen | None = None,
    prometheus: bool = True,
) -> RunResult:
    """Collect a run into ``config.output_jsonl_fpath``: fresh, or resumed.

    With ``resume_from_cache`` (or ``resubmit``), a folder holding a run is resumed: its
    manifest is checked against the input, plan settings and agent set, and only what
    docs/protocol.md section 8 says is not done is dispatched. A folder holding no outcome is
    started afresh. A folder whose manifest or materialized inputs are missing while it holds
    outcomes is refused, never cleared.

    Args:
        config: the run's settings.
        deployment: the deployment; discovered from the config when None.
        observer: where lines and progress go (`observe`; default: lines on stderr).
        watchers: tasks run beside the engine (`session.Watcher`), such as
            `signals.watch_signals`.
        transport: the ``/run`` transport (tests); one is opened when None.
        resubmit: also dispatch rollouts that are done but did not land (``trollout resubmit``).
        stop_when: given the collector, returns a reason to wind the run down as a signal
            would; the result's ``stopped`` says it did.
        prometheus: False serves no Prometheus endpoint whatever the config and ``OTEL_*``
            ask (`telemetry_settings`): a Ray block, which may share its host with others.

    Raises:
        ConfigError: no input or output path given.
        InputError: bad input rows (nothing written, nothing dispatched).
        DeploymentError: the deployment cannot be found or lacks an agent the rows need.
        RunChangedError: resuming a run whose input, plan settings or agent set changed.
        RunFolderError: the folder is locked, or cannot be resumed (nothing is cleared).
        IncompleteEvaluationError: ``require_complete`` and not every rollout landed.

    Cancellation: cancelling interrupts rollouts in flight; they are recorded as omitted and
    every settled outcome is flushed before this returns, so the folder stays resumable.
    """
    observer = observer or StreamObserver()
    if config.resubmit and resubmit is None:  # NeMo Gym's +resubmit=true resumes
        resubmit = Resubmit()
    resuming = config.resume_from_cache or resubmit is not None
    if stop_when is not None:
        watchers = (*watchers, stop_when_watcher(stop_when))
    # 1. Check what needs neither the deployment nor a write.
    layout, watching = checks.check_before_writing(config, resuming=resuming, prometheus=prometheus)
    # 2. Find the deployment.
    if deployment is None:
        deployment = await load_deployment(config)
    # 3. Plan: bad input, a full disk, a mismatched batch manifest are refused before a write.
    plan = None
    if not resuming or folder_state(layout) is FolderState.NEW:
        plan = checks.plan(config, deployment)
        checks.check_free_space(layout, plan)
        checks.check_batch_manifest(config, plan)
    started = trio.current_time()
    later = partial(checks.plan, config, deployment)
    warn = partial(_warn, observer)
    # 4. Start telemetry, and open (or resume) the run folder. Telemetry stays open through
    # aggregation and the health step, so its last export carries them.
    async with _telemetry(watching, config, observer) as telemetry:
        async with open_run_folder(
            config, deployment, plan=plan or later, resubmit=resubmit, warn=warn
        ) as run:
            # 5. Run the engine with its watchers.
            session = await run_session(
                run.store,
                config,
                deployment.run_url_resolver(),
                run.rows(),
                total=run.to_dispatch,
                observer=observer,
                watchers=watchers,
                transport=transport,
                policy_model_servers=deployment.policy_model_servers(),
                telemetry=telemetry,
                job_attributes={
                    "trollout.run.id": run.manifest.run_id,
                    "trollout.run": str(layout.output),
                },
            )
        # 6. Refuse an incomplete run under require_complete; aggregate.
        collector = session.collector
        aggregate = None
        if not session.interrupted:
            await checks.check_complete(layout, config)
            aggregate = await checks.aggregate(layout, config, deployment)
        if config.batch_manifest_fpath and aggregate is None:
            await trio.to_thread.run_sync(checks.batch_status_not_aggregated, layout, config)
        # 7. The health check: after the metrics, as in NeMo Gym; never after an abort.
        health: list[str] = []
        if aggregate is not None:
            observe = telemetry.health_checked if telemetry is not None else None
            health = await trio.to_thread.run_sync(
                after_run, [layout.rollouts], layout.rollouts.parent, config, aggregate, observe
            )
    return RunResult(
        layout=layout,
        expected=run.expected,
        progress=collector.progress,
        elapsed_s=trio.current_time() - started,
        max_resident=collector.max_resident,
        resumed=run.resumed,
        timing=timing_report(collector),
        signal=session.signal,
        deadline_reached=session.deadline_reached,
        aggregate=aggregate,
        health=tuple(health),
        differences=tuple(differences(config)),
        stopped=session.stopped,
        telemetry=telemetry,
    )


@asynccontextmanager
async def _telemetry(
    settings: TelemetrySettings | None, config: RunConfig, observer: RunObserver
) -> AsyncIterator[Telemetry | None]:
    """Open the run's telemetry when asked for (OpenTelemetry is imported only then)."""
    if settings is None:
        yield None
        return
    try:
        from ..telemetry.runtime import open_telemetry
    except ImportError as exc:
        raise telemetry_missing(exc) from exc
    stream = line_stream(observer)
    async with open_telemetry(settings, max_attempts=config.max_attempts, stream=stream) as t:
        yield t


def _warn(observer: RunObserver, text: str) -> None:
    observer.message(f"trollout: warning: {text}")


def telemetry_missing(exc: ImportError) -> ConfigError:
    """The error of a run that asked for telemetry OpenTelemetry cannot serve (Ray's too)."""
    return ConfigError(
        f"telemetry was asked for (--otlp-endpoint, --metrics-port or OTEL_*) but cannot "
        f"load: {exc}; pip install 'trollout[telemetry]', or unset it"
    )
