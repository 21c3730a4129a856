"""`trollout collect`: compose plan, deployment, store and engine into one run.

The order is the contract (design.md, Durability): everything that can refuse the run (config,
deployment discovery, every input row) is checked before a single file is touched; then the run
folder is locked and cleared, the materialized inputs are written and fsynced, and only then does
the first rollout go out. The rows dispatched are read back from the materialized-inputs file, so
a fresh run and a resume dispatch from the same source.

`collect_run` uses only the public API an embedding driver has (`plan_rollouts`, `discover`,
`open_run_store`, `open_collector`); the click command is a thin shell around it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator
from typing import IO

import click

import attrs
import httpx
import trio

from .. import jsonl
from ..collector.deployment import Deployment, discover
from ..collector.engine import Collector, Progress, open_collector
from ..collector.plan import plan_rollouts
from ..collector.transport import H11Transport
from ..config import RunConfig
from ..errors import ConfigError
from ..records import Identity, MaterializedRow
from ..recovery.layout import RunLayout
from ..recovery.store import open_run_store
from .common import build_run_config, collect_options, fail, live_mode, print_summary, run_trio
from .progress import ProgressReporter

__all__ = ["RunResult", "collect", "collect_run", "load_deployment", "resolver_for"]


@attrs.frozen
class RunResult:
    """What a finished collection run reports."""

    layout: RunLayout
    expected: int
    tasks: int
    progress: Progress
    elapsed_s: float
    max_in_flight: int
    max_resident: int


async def load_deployment(config: RunConfig) -> Deployment:
    """Find the deployment: explicit ``--agent-url``s, else the head server.

    Cancellation: a checkpoint; nothing has been written yet, so a retry is safe.
    """
    if config.agent_urls:
        return Deployment.from_agent_urls(config.agent_urls)
    head = config.head_server or "http://127.0.0.1:11000"
    transport = H11Transport(
        connect_timeout_s=config.connect_timeout_s, read_timeout_s=min(config.read_timeout_s, 60.0)
    )
    async with httpx.AsyncClient(transport=transport) as client:
        return await discover(client, head)


def resolver_for(deployment: Deployment) -> Callable[[Identity], str]:
    """Return a function from a rollout's identity to its ``/run`` URL."""
    cache: dict[tuple[str | None, str | None], str] = {}

    def resolve(identity: Identity) -> str:
        key = (identity.environment_server, identity.agent_name)
        url = cache.get(key)
        if url is None:
            if identity.environment_server is not None:
                base = deployment.environment_server_url(identity.environment_server)
            else:
                base = deployment.route(identity.agent_name or "").url
            url = cache[key] = base.rstrip("/") + "/run"
        return url

    return resolve


def _materialized(layout: RunLayout) -> Iterator[MaterializedRow]:
    for row in jsonl.read_rows(layout.materialized_inputs):
        yield MaterializedRow.from_body(row)


async def collect_run(
    config: RunConfig,
    *,
    deployment: Deployment | None = None,
    progress_stream: IO[str] | None = None,
    live: bool | None = None,
) -> RunResult:
    """Collect a fresh run into ``config.output_jsonl_fpath``.

    Raises:
        ConfigError: no input or output path given.
        InputError: bad input rows (nothing written, nothing dispatched).
        DeploymentError: the deployment cannot be found or lacks an agent the rows need.

    Cancellation: cancelling interrupts rollouts in flight; they are recorded as omitted and
    every settled outcome is flushed before this returns, so the folder stays resumable.
    """
    if not config.input_jsonl_fpath:
        raise ConfigError("no input file: pass INPUT or +input_jsonl_fpath=<file.jsonl>")
    if not config.output_jsonl_fpath:
        raise ConfigError("no output file: pass -o OUT.jsonl or +output_jsonl_fpath=<file.jsonl>")
    if deployment is None:
        deployment = await load_deployment(config)
    plan = plan_rollouts(config.input_jsonl_fpath, config, deployment)
    layout = RunLayout.for_output(config.output_jsonl_fpath)
    started = trio.current_time()
    async with open_run_store(layout, config, expected=plan.expected, fresh=True) as store:
        await store.write_materialized_inputs(plan.rows())
        reporter = ProgressReporter(total=plan.expected, stream=progress_stream or sys.stderr,
                                    live=live)
        async with open_collector(
            config=config, resolve=resolver_for(deployment), sink=store
        ) as collector, trio.open_nursery() as nursery:
            nursery.start_soon(reporter.run, collector)
            await nursery.start(store.run_housekeeping)
            await collector.collect(_materialized(layout))
            nursery.cancel_scope.cancel(reason="run finished")
    return RunResult(
        layout=layout,
        expected=plan.expected,
        tasks=plan.tasks,
        progress=collector.progress,
        elapsed_s=trio.current_time() - started,
        max_in_flight=collector.limiter.total_tokens,
        max_resident=collector.max_resident,
    )


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED, metavar="INPUT [+key=value ...]")
@collect_options
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
    print_summary(result, title=f"trollout collect: {Path(result.layout.rollouts).name}")


async def _collect(config: RunConfig, live: bool | None) -> RunResult:
    return await collect_run(config, live=live)
