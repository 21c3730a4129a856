"""`open_rollouts`: the long-lived object a training loop opens batches from, in Trio.

One `Rollouts` owns, for the whole loop, the deployment, the transport and its keep-alive
connections, the collector (its limiter, retry budgets and breakers, its writer), and optionally
a folder where each batch is recorded as a shard (`trollout.run.shards`)::

    async with trollout.open_rollouts(urls, config=config, record_output_dir="runs/rl") as ro:
        for step in range(steps):
            rows = ro.plan(dataset_rows)                  # repeats, agents, seeds, indices
            async with ro.open_batch(rows, record_shard=f"step-{step:04d}") as batch:
                async for item in batch:                  # completion order
                    learn(item.row, item.outcome)

The batch semantics (completion order, row copies, run ids, closing early) are the engine's
(`collector.batch`); this module only composes them with planning and shard recording. The
asyncio and blocking front ends (`aio`, `sync`) run exactly this object in a Trio thread.

Design note: numbering across steps. A step's batch is often the rollouts fed back from
earlier steps (rows a batch returned, which keep their task and rollout indices) plus tasks
planned now, and a batch refuses two rows with one (task, rollout). So `Rollouts.plan` numbers
each call's tasks after every task it planned before (`next_task_index`): no two rows planned
by one `Rollouts` ever share numbers, and ``[*fed_back, *ro.plan(fresh)]`` is a valid batch
with no bookkeeping by the trainer. ``start_task_index=`` numbers a call from a given index
(0: as a run plans; a trainer resumed from a checkpoint passes where it was). Rejected:
numbering every call from 0 (what this replaced: fed-back rows of step 1 collided with step 2's
fresh tasks, with an error whose hint did not apply), a ``start_task_index`` the trainer must
always compute (it must then track every fed-back row's numbers), and `plan` passing
already-planned rows through among fresh ones (a row carrying ``_ng_task_index`` is already
valid planning input, a task that keeps its index and is repeated ``num_repeats`` times, as a
run re-planning its own output does; giving it a second meaning by context would change runs
that rely on the first).
"""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from ..collector.deployment.discovery import Deployment
from ..collector.deployment.served_config import kind
from ..collector.engine.batch import Batch, BatchOutcome, BatchRows, check_run_id, new_run_id
from ..collector.engine.collector import Collector, open_collector
from ..collector.http.transport import PostTransport
from ..collector.planning.plan import plan_rows
from ..errors import ArgumentTypeError, ConfigError
from ..records import MaterializedRow
from ..run.shards import open_shard
from ..settings import RunConfig

__all__ = ["Rollouts", "open_rollouts"]


class Rollouts:
    """Batches of rollouts on one collector, kept across a training loop's steps.

    Attributes:
        deployment: where rollouts go.
        config: the collection settings (concurrency, timeouts, retries, planning).
        collector: the engine every batch shares.
        record_output_dir: the default folder for shards (None: batches are not recorded
            unless a batch names a folder).
    """

    def __init__(
        self,
        deployment: Deployment,
        config: RunConfig,
        collector: Collector,
        record_output_dir: str | os.PathLike[str] | None,
    ) -> None:
        self.deployment = deployment
        self.config = config
        self.collector = collector
        self.record_output_dir = record_output_dir
        self._next_task = 0
        self._numbering = threading.Lock()  # the blocking front end plans from any thread

    @property
    def next_task_index(self) -> int:
        """The task index `plan` gives the next call's first task: one past every task it has
        planned (module docstring)."""
        return self._next_task

    def plan(
        self, rows: Sequence[Mapping[str, Any]], *, start_task_index: int | None = None
    ) -> list[MaterializedRow]:
        """Materialize dataset rows with this run's settings (repeats, agents, seeds, indices).

        Tasks are numbered after every task this object planned before (`next_task_index`), so
        rows fed back from earlier batches and rows planned now go in one batch together:
        ``ro.open_batch([*fed_back, *ro.plan(fresh)])``. Feed returned rows back as they are;
        planning them again makes each a task of its own, repeated ``num_repeats`` times.

        Args:
            rows: dataset rows.
            start_task_index: number this call's tasks from here instead (0: as a run does).

        Raises:
            InputError: every problem of the rows, together.
            ConfigError: a negative or non-int ``start_task_index``.
        """
        with self._numbering:
            start = self._next_task if start_task_index is None else start_task_index
            planned = list(
                plan_rows(rows, self.config, self.deployment, start_task_index=start).rows()
            )
            last = max((row.identity.task_index for row in planned), default=-1)
            self._next_task = max(self._next_task, last + 1)
        return planned

    @asynccontextmanager
    async def open_batch(
        self,
        rows: BatchRows,
        *,
        run_id: str | None = None,
        record_shard: str | None = None,
        record_output_dir: str | os.PathLike[str] | None = None,
        enrich_results: bool = True,
    ) -> AsyncIterator[Batch]:
        """Open a batch: ``async with rollouts.open_batch(rows) as batch: async for item in ...``.

        Args:
            rows: materialized rows (`plan`), or rows an earlier batch returned.
            run_id: the batch's run id (default: a fresh one); it prefixes every rollout id
                and, when recorded, is the shard's run id.
            record_shard: record the batch as shard ``rollouts-<record_shard>.jsonl`` (label
                ``[A-Za-z0-9][A-Za-z0-9_.-]*``); an existing shard of that label is replaced.
            record_output_dir: the shard's folder (default: `record_output_dir`).
            enrich_results: enrich each landed rollout as collection does (model-call capture,
                trajectory, ``ng_perf``: `trollout.enrichment`, per the config's
                observability settings); a recorded shard holds the enriched rows. False:
                outcomes exactly as the servers replied.

        Leaving the block closes the batch (`Batch.aclose`): what has not finished is cancelled,
        and every accepted rollout has reached the sink (the shard) when the block is left.

        Raises:
            ConfigError: a bad label or run id, or a shard without a folder.
            InputError: a row the batch cannot dispatch (before anything is written).
            RunFolderLockedError: another writer holds the shard.

        Cancellation: entering is a checkpoint; exit is shielded (see above).
        """
        if record_shard is None:
            if record_output_dir is not None:
                raise ConfigError("record_output_dir= needs record_shard=<label> too")
            async with self.collector.open_batch(
                rows, run_id=run_id, enrich_results=enrich_results
            ) as batch:
                yield batch
            return
        folder = record_output_dir if record_output_dir is not None else self.record_output_dir
        if folder is None:
            raise ConfigError(
                f"record_shard={record_shard!r} needs a folder: pass record_output_dir= here or "
                "to open_rollouts"
            )
        run_id = check_run_id(run_id) if run_id is not None else new_run_id()
        async with (
            open_shard(
                self.config,
                self.deployment,
                rows,
                output_dir=folder,
                label=record_shard,
                run_id=run_id,
            ) as shard,
            self.collector.open_batch(  # the shard's copies, stamped once (`run_ids`)
                shard.rows, run_id=run_id, sink=shard.store, enrich_results=enrich_results
            ) as batch,
        ):
            yield batch

    async def run_batch(self, rows: BatchRows, **options: Any) -> list[BatchOutcome]:
        """Run a batch to its end and return its outcomes in completion order.

        Takes `open_batch`'s options.

        Cancellation: as `open_batch`'s exit: a cancelled call has closed its batch.
        """
        async with self.open_batch(rows, **options) as batch:
            return [item async for item in batch]


def _deployment_of(where: Deployment | Mapping[str, str]) -> Deployment:
    if isinstance(where, Deployment):
        return where
    if not isinstance(where, Mapping):  # a URL string would fail deep inside as AttributeError
        raise ArgumentTypeError(
            f"open_rollouts: deployment must be a mapping of agent name to base URL, such as "
            f"{{'math_agent': 'http://127.0.0.1:8000'}}, or a Deployment from trollout.discover "
            f"(got {kind(where)})"
        )
    return Deployment.from_agent_urls(where)


def _config_of(config: RunConfig | None) -> RunConfig:
    if config is None:
        return RunConfig()
    if not isinstance(config, RunConfig):
        raise ArgumentTypeError(
            f"open_rollouts: config must be a trollout.RunConfig (got {kind(config)}); build one "
            "with trollout.RunConfig(num_repeats=..., ...), or from a mapping of settings with "
            "trollout.load_config(options={...})"
        )
    return config


@asynccontextmanager
async def open_rollouts(
    deployment: Deployment | Mapping[str, str],
    *,
    config: RunConfig | None = None,
    record_output_dir: str | os.PathLike[str] | None = None,
    transport: PostTransport | None = None,
    seed: int | None = None,
) -> AsyncIterator[Rollouts]:
    """Open a long-lived `Rollouts` for a training loop.

    Args:
        deployment: a `Deployment` (`discover`) or ``{agent name: base URL}``.
        config: collection and planning settings (default: `RunConfig()`).
        record_output_dir: where batches given a ``record_shard`` are recorded.
        transport: the ``/run`` transport (default: an `Http11Transport`, closed at exit).
        seed: seeds the retry jitter (tests).

    Raises:
        ConfigError: bad agent URLs.
        ArgumentTypeError: ``deployment`` or ``config`` of another type (a URL string, a dict).

    Cancellation: leaving the block, however, closes every batch still open and waits until
    every accepted rollout has reached its sink.
    """
    resolved = _deployment_of(deployment)
    settings = _config_of(config)
    async with open_collector(
        config=settings,
        resolve=resolved.run_url_resolver(),
        transport=transport,
        seed=seed,
        policy_model_servers=resolved.policy_model_servers(),
    ) as collector:
        yield Rollouts(resolved, settings, collector, record_output_dir)
