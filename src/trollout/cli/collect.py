"""`trollout collect`: compose plan, deployment, run folder and engine into one run.

The order is the contract (docs/design.md, Durability): everything that can refuse the run (config,
deployment discovery, every input row, the folder's preflight checks, free space) is checked
before a single file is touched; then `recovery.run_folder.open_run_folder` locks the folder and
either starts the run (materialized inputs, then the manifest, both fsynced) or resumes it (the
manifest checked, what is not done decided); only then does the first rollout go out, its
attempt number already in the ledger.

`collect_run` uses only the public API an embedding driver has (`plan_rollouts`, `discover`,
`open_run_folder`, `open_collector`); the click command is a thin shell around it.
"""

from __future__ import annotations

import shutil
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

import attrs
import click
import trio
from rich.console import Console

from ..collector.deployment.discovery import Deployment, discover
from ..collector.engine.progress import Progress
from ..collector.http.transport import PostTransport
from ..collector.planning.input_file import FileSource
from ..collector.planning.plan import Plan, plan_rollouts
from ..config import RunConfig
from ..errors import ConfigError, IncompleteEvaluationError, RunFolderError
from ..metrics import AggregateOptions, AggregateResult, aggregate_run, print_report
from ..metrics.batch import check_members, read_batch_manifest, write_batch_status
from ..metrics.reader import Collection
from ..nemo_keys import differences
from ..recovery.files import format_bytes
from ..recovery.layout import RunLayout
from ..recovery.manifest import FolderState, folder_state
from ..recovery.resume import Fate, Resubmit, ResumeRules, RunTally, scan_run
from ..recovery.run_folder import open_run_folder
from ..recovery.store import check_run_folder
from ..telemetry import TelemetrySettings, telemetry_settings
from ..text import visible
from .common import (
    EXIT_FAILED,
    build_run_config,
    collect_options,
    fail,
    http_client,
    live_mode,
    print_summary,
    run_trio,
)
from .scaleout import collect_any, scaleout_options
from .session import StopWhen, run_session, timing_report

if TYPE_CHECKING:
    from ..telemetry.runtime import Telemetry

__all__ = [
    "RunResult",
    "check_before_writing",
    "collect",
    "collect_run",
    "load_deployment",
    "report_run",
    "resume_options",
]

F = TypeVar("F", bound=Callable[..., Any])


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
    differences: tuple[str, ...] = ()
    stopped: str | None = None


async def load_deployment(config: RunConfig) -> Deployment:
    """Find the deployment: explicit ``--agent-url``s, else the head server.

    Cancellation: a checkpoint; nothing has been written yet, so a retry is safe.
    """
    if config.agent_urls:
        return Deployment.from_agent_urls(config.agent_urls)
    head = config.head_server or "http://127.0.0.1:11000"
    read_timeout_s = min(config.read_timeout_s, 60.0)
    async with http_client(
        connect_timeout_s=config.connect_timeout_s, read_timeout_s=read_timeout_s
    ) as client:
        return await discover(client, head, env_allow=config.served_config_env_allow)


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
    """Collect a run into ``config.output_jsonl_fpath``: fresh, or resumed.

    With ``resume_from_cache`` (or ``resubmit``), a folder holding a run is resumed: its
    manifest is checked against the input, plan settings and agent set, and only what
    docs/protocol.md section 8 says is not done is dispatched. A folder holding no outcome is
    started afresh. A folder whose manifest or materialized inputs are missing while it holds
    outcomes is refused, never cleared.

    Args:
        config: the run's settings.
        deployment: the deployment; discovered from the config when None.
        progress_stream: where progress lines go (stderr when None).
        live: force the live display on or off (None: decide by terminal).
        transport: the ``/run`` transport (tests); one is opened when None.
        resubmit: also dispatch rollouts that are done but did not land (``trollout resubmit``).
        stop_when: given the collector, returns a reason to wind the run down as a signal
            would (`session`); the result's ``stopped`` says it did.
        prometheus: False serves no Prometheus endpoint whatever the config and ``OTEL_*``
            ask (`telemetry_settings`): a Ray block, which may share its host with others.

    Raises:
        ConfigError: no input or output path given.
        InputError: bad input rows (nothing written, nothing dispatched).
        DeploymentError: the deployment cannot be found or lacks an agent the rows need.
        RunChangedError: resuming a run whose input, plan settings or agent set changed.
        RunFolderError: the folder is locked, or cannot be resumed (nothing is cleared).

    Cancellation: cancelling interrupts rollouts in flight; they are recorded as omitted and
    every settled outcome is flushed before this returns, so the folder stays resumable.
    """
    if config.resubmit and resubmit is None:  # NeMo Gym's +resubmit=true resumes
        resubmit = Resubmit()
    resuming = config.resume_from_cache or resubmit is not None
    layout, watching = check_before_writing(config, resuming=resuming, prometheus=prometheus)
    if deployment is None:
        deployment = await load_deployment(config)
    stream = progress_stream or sys.stderr
    plan = None
    if not resuming or folder_state(layout) is FolderState.NEW:
        plan = _plan(config, deployment)  # bad input is refused before a file is touched
        _check_free_space(layout, plan)
        _check_batch_manifest(config, plan)
    started = trio.current_time()
    later = partial(_plan, config, deployment)
    warn = partial(_warn, stream)
    async with (
        _telemetry(watching, config, stream) as telemetry,
        open_run_folder(
            config, deployment, plan=plan or later, resubmit=resubmit, warn=warn
        ) as run,
    ):
        end = await run_session(
            run.store,
            config,
            deployment.run_url_resolver(),
            run.rows(),
            total=run.to_dispatch,
            stream=stream,
            live=live,
            transport=transport,
            policy_model_servers=deployment.policy_model_servers(),
            stop_when=stop_when,
            telemetry=telemetry,
            job_attributes={
                "trollout.run.id": run.manifest.run_id,
                "trollout.run": str(layout.output),
            },
        )
    collector = end.collector
    aggregate = None
    if not end.interrupted:
        await _check_complete(layout, config)
        aggregate = await _aggregate(layout, config, deployment)
    if config.batch_manifest_fpath and aggregate is None:
        await trio.to_thread.run_sync(_batch_status_not_aggregated, layout, config)
    return RunResult(
        layout=layout,
        expected=run.expected,
        progress=collector.progress,
        elapsed_s=trio.current_time() - started,
        max_resident=collector.max_resident,
        resumed=run.resumed,
        timing=timing_report(collector),
        signal=end.signal,
        deadline_reached=end.deadline_reached,
        aggregate=aggregate,
        differences=tuple(differences(config)),
        stopped=end.stopped,
    )


def check_before_writing(
    config: RunConfig, *, resuming: bool, prometheus: bool = True
) -> tuple[RunLayout, TelemetrySettings | None]:
    """Run every check of a collection run that needs neither the deployment nor a write.

    `collect_run` runs it first; ``trollout sbatch`` runs it for every shard its jobs will
    collect, so a script is never written for a run whose jobs would all refuse it. Read-only.

    Returns:
        The run folder, and where its telemetry goes (None: nowhere).

    Raises:
        ConfigError: no input or output path given, or a bad ``OTEL_*`` value.
        InputError: the input is missing, unreadable or not a regular file (when it will be
            planned: a fresh run, or a resume of a folder holding no run yet).
        RunFolderError: the folder's preflight checks (`recovery.preflight`).
    """
    if not config.output_jsonl_fpath:
        raise ConfigError("no output file: pass -o OUT.jsonl or +output_jsonl_fpath=<file.jsonl>")
    if not config.input_jsonl_fpath and not resuming:
        raise ConfigError("no input file: pass INPUT or +input_jsonl_fpath=<file.jsonl>")
    layout = RunLayout.for_output(config.output_jsonl_fpath)
    check_run_folder(layout, config, fresh=not resuming)  # before slow work; the store rechecks
    if config.input_jsonl_fpath and (not resuming or folder_state(layout) is FolderState.NEW):
        FileSource(config.input_jsonl_fpath).check_readable()  # before the deployment is asked
    # A bad OTEL_* value is refused before any write.
    return layout, telemetry_settings(config, prometheus=prometheus)


@asynccontextmanager
async def _telemetry(
    settings: TelemetrySettings | None, config: RunConfig, stream: IO[str]
) -> AsyncIterator[Telemetry | None]:
    """Open the run's telemetry when asked for (OpenTelemetry is imported only then)."""
    if settings is None:
        yield None
        return
    try:
        from ..telemetry.runtime import open_telemetry
    except ImportError as exc:
        raise ConfigError(
            f"telemetry was asked for (--otlp-endpoint, --metrics-port or OTEL_*) but cannot "
            f"load: {exc}; pip install 'trollout[telemetry]', or unset it"
        ) from exc
    async with open_telemetry(settings, max_attempts=config.max_attempts, stream=stream) as t:
        yield t


def _warn(stream: IO[str], text: str) -> None:
    print(f"trollout: warning: {text}", file=stream)


def _plan(config: RunConfig, deployment: Deployment) -> Plan:
    if not config.input_jsonl_fpath:
        raise ConfigError("no input file: pass INPUT or +input_jsonl_fpath=<file.jsonl>")
    return plan_rollouts(config.input_jsonl_fpath, config, deployment)


def _check_batch_manifest(config: RunConfig, plan: Plan) -> None:
    """Refuse a plan that does not match its batch manifest's members (before any write)."""
    if not config.batch_manifest_fpath:
        return
    members = read_batch_manifest(config.batch_manifest_fpath)
    tasks: dict[str, set[int]] = {}
    rollouts: Counter[str] = Counter()
    for row in plan.rows():
        agent = row.identity.agent_name or row.identity.environment_server or ""
        tasks.setdefault(agent, set()).add(row.identity.task_index)
        rollouts[agent] += 1
    check_members(members, {agent: (len(t), rollouts[agent]) for agent, t in tasks.items()})


def _batch_status_not_aggregated(layout: RunLayout, config: RunConfig) -> None:
    """Write the batch status of a run whose metrics were not computed (blocking)."""
    assert config.batch_manifest_fpath is not None
    collection = Collection(None)
    collection.read([layout.output])
    collection.resolve(count_missing=False)
    write_batch_status(
        config.batch_manifest_fpath,
        read_batch_manifest(config.batch_manifest_fpath),
        collection,
        aggregation="not_run",
        cap=config.max_attempts,
        retry_timeouts=config.retry_terminal_timeouts,
    )


def _check_free_space(layout: RunLayout, plan: Plan) -> None:
    """Refuse a plan whose materialized inputs alone would not fit on the output's disk."""
    folder = layout.output.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    if plan.materialized_bytes > free:
        raise RunFolderError(
            f"the plan's {plan.expected:,} rollouts need about "
            f"{format_bytes(plan.materialized_bytes)} of materialized inputs, but "
            f"{str(folder)!r} has {format_bytes(free)} free; free space, or plan fewer "
            "rollouts (--limit, --num-repeats)"
        )


async def _check_complete(layout: RunLayout, config: RunConfig) -> None:
    """Under ``require_complete``, refuse a run that left unfinished work (before any score)."""
    if not config.require_complete:
        return
    rules = ResumeRules(
        max_attempts=config.max_attempts, retry_terminal_timeouts=config.retry_terminal_timeouts
    )
    tally = (await trio.to_thread.run_sync(scan_run, layout, rules)).tally
    unfinished = tally.expected - tally.count(Fate.LANDED)
    if unfinished:
        raise IncompleteEvaluationError(
            unfinished=unfinished, expected=tally.expected, retryable=tally.retryable_remains
        )


async def _aggregate(
    layout: RunLayout, config: RunConfig, deployment: Deployment
) -> AggregateResult | None:
    """Compute local and server metrics of the run (skipped with ``disable_aggregation``)."""
    if config.disable_aggregation:
        return None
    options = AggregateOptions.of_run(config)
    targets = deployment.aggregate_metrics_targets()
    timeouts = {"connect_timeout_s": config.connect_timeout_s, "read_timeout_s": 600.0}
    async with http_client(**timeouts) as client:
        return await aggregate_run(layout, options=options, targets=targets, client=client)


def resume_options(f: F) -> F:
    """Attach the options that steer a resume (shared by collect, resume and resubmit)."""
    options = [
        click.option(
            "--allow-unsafe-resume",
            is_flag=True,
            default=None,
            help="Resume even if the input, plan settings or agent set changed (the saved "
            "materialized rows are still what is dispatched).",
        ),
        click.option(
            "--max-attempts",
            type=int,
            help="Attempts per rollout before it counts as done (default: env "
            "NEMO_GYM_MAX_ROLLOUT_ATTEMPTS, else 3).",
        ),
        click.option(
            "--retry-terminal-timeouts",
            is_flag=True,
            default=None,
            help="Retry rollouts whose terminal failure was a timeout.",
        ),
        click.option(
            "--no-retry-failed",
            "retry_failed_on_resume",
            flag_value=False,
            default=None,
            help="Resume only rollouts that never finished (interrupted or never started); "
            "retryable failures stay failures (+retry_failed_on_resume=false).",
        ),
        click.option(
            "--longest-first",
            "dispatch_longest_first",
            is_flag=True,
            default=None,
            help="Dispatch the rollouts that took longest before first.",
        ),
        click.option(
            "--record-omitted",
            "record_omitted_rollouts",
            is_flag=True,
            default=None,
            help="Write a row for each interrupted or never-started attempt.",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED, metavar="INPUT [+key=value ...]")
@collect_options
@click.option(
    "--resume",
    "resume_from_cache",
    is_flag=True,
    default=None,
    help="Resume the run in the output folder (+resume_from_cache=true): dispatch "
    "only what is not done; a folder with no outcomes starts afresh.",
)
@resume_options
@scaleout_options
def collect(args: tuple[str, ...], live: str, **options: Any) -> None:
    """Collect rollouts for every task row of INPUT (a JSONL file).

    Each rollout is one POST /run to the agent (or the environment server fronting it); the
    outcome lands in the output file (successes), OUT_failures.jsonl (typed failures) or nowhere
    (kill-shaped replies). Any NeMo Gym setting can be given as +key=value, for example
    +num_repeats=4 +agent_map={math:math_agent}.
    """
    options = {k: v for k, v in options.items() if v is not None and v != ()}
    try:
        config = build_run_config(args, options)
    except ConfigError as exc:
        fail(str(exc))
    result: RunResult = run_trio(_collect, config, live_mode(live))
    report_run(result, title=f"trollout collect: {Path(result.layout.rollouts).name}")


def report_run(result: RunResult, *, title: str) -> None:
    """Print a session's summary, timing report and metrics; exit as the run ended.

    Exit codes: 128 + the signal after SIGINT/SIGTERM (130/143); 1 when ``--max-run-time``
    ended the run or a server's metrics call failed; otherwise return (exit 0).
    """
    tally = result.resumed
    shown = result if tally is None else attrs.evolve(result, expected=tally.to_dispatch)
    print_summary(shown, title=title)
    if tally is not None:
        done = tally.expected - tally.to_dispatch
        click.echo(
            f"resumed: {done} of {tally.expected} rollouts were done "
            f"({tally.fates['landed']} landed); dispatched {tally.to_dispatch}"
        )
    click.echo(result.timing)
    for line in result.differences:
        click.echo(f"differs from NeMo Gym: {line}")
    if result.aggregate is not None:
        print_report(result.aggregate, Console())
        click.echo(f"metrics: {visible(str(result.aggregate.metrics_path))}")
        if result.aggregate.report_path is not None:
            click.echo(f"report:  {visible(str(result.aggregate.report_path))}")
    if result.signal is not None:
        click.echo(f"stopped by {signal.Signals(result.signal).name}; resume to finish", err=True)
        sys.exit(128 + result.signal)
    if result.deadline_reached:
        fail("--max-run-time reached before every rollout ran; resume to finish", EXIT_FAILED)
    if result.aggregate is not None and not result.aggregate.ok:
        fail(
            "a server's /aggregate_metrics call failed (see above); local metrics were written",
            EXIT_FAILED,
        )


async def _collect(config: RunConfig, live: bool | None) -> RunResult:
    return await collect_any(config, live)  # --ray goes to Ray, the rest to collect_run
