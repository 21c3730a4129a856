"""Recording a batch as a shard: a run folder per training step that the CLI resumes.

A shard labelled ``L`` in folder ``D`` is the run folder of ``D/rollouts-L.jsonl``, opened with
`recovery.run_folder.open_run_folder` like any run: the batch's stamped rows are its
materialized inputs (and its input: the manifest names that file, so ``trollout resume
D/rollouts-L.jsonl`` checks and dispatches exactly those rows), the manifest carries the batch's
run id and the deployment, and every row's first attempt is reserved in the ledger before the
first dispatch. The folder's lock is held while the batch runs, and the store checks before each
write that it is still the folder's writer (`recovery.lock.RunLock.verify`), so two writers
never interleave. Opening a label again replaces what the label held, once the new inputs are
complete on disk (a replayed step never duplicates rows).

Shards of a training run aggregate without collisions: every rollout id carries its shard's run
id (`collector.batch.shard_rollout_id`), so step 3's task 0 is never step 4's task 0.
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs

from ..collector.batch import BatchRows, RowStamper
from ..collector.deployment import AGENTS, Deployment
from ..config import RunConfig
from ..errors import ConfigError
from ..records import MaterializedRow
from ..recovery.layout import AUXILIARY_SUFFIXES, RunLayout
from ..recovery.run_folder import MaterializedRows, open_run_folder
from ..recovery.store import RunStore

__all__ = ["SHARD_LABEL", "Shard", "open_shard", "shard_layout"]

SHARD_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@attrs.frozen
class Shard:
    """An open shard: its store (the batch's sink) and the rows it records."""

    layout: RunLayout
    store: RunStore
    rows: list[MaterializedRow]
    run_id: str


def shard_layout(output_dir: str | os.PathLike[str], label: str) -> RunLayout:
    """Return the run folder of shard ``label`` in ``output_dir`` (``rollouts-<label>.jsonl``).

    Raises:
        ConfigError: the label does not match ``[A-Za-z0-9][A-Za-z0-9_.-]*``, or ends like a
            run's sibling file (``_failures``, ``_materialized_inputs``, ``_attempts``).
    """
    if not isinstance(label, str) or not SHARD_LABEL.fullmatch(label):
        raise ConfigError(
            f"record_shard {label!r} must match {SHARD_LABEL.pattern}; name the shard with "
            "letters, digits, '.', '_' and '-', for example 'step-0042'"
        )
    if label.endswith(AUXILIARY_SUFFIXES):
        raise ConfigError(
            f"record_shard {label!r} ends like a run's sibling file "
            f"({', '.join(AUXILIARY_SUFFIXES)}), which aggregation would skip; choose another"
        )
    return RunLayout.for_output(Path(output_dir) / f"rollouts-{label}.jsonl")


def shard_config(config: RunConfig, deployment: Deployment, layout: RunLayout) -> RunConfig:
    """Return the settings a shard is recorded (and later resumed) with."""
    where: dict[str, Any]
    if deployment.head_url is not None:
        where = {"head_server": deployment.head_url, "agent_urls": {}}
    else:
        agents = {s.name: s.url for s in deployment.servers if s.server_type == AGENTS}
        where = {"agent_urls": agents}
    return attrs.evolve(
        config,
        input_jsonl_fpath=None,
        output_jsonl_fpath=str(layout.output),
        overwrite=True,
        resume_from_cache=False,
        **where,
    )


@asynccontextmanager
async def open_shard(
    config: RunConfig,
    deployment: Deployment,
    rows: BatchRows,
    *,
    output_dir: str | os.PathLike[str],
    label: str,
    run_id: str,
) -> AsyncIterator[Shard]:
    """Open (or replace) shard ``label`` for a batch of ``rows`` dispatched as run ``run_id``.

    Raises:
        ConfigError: a bad label; InputError: a row the batch cannot dispatch (nothing
            written either way).
        RunFolderLockedError: another writer holds the shard.
        RunFolderError: the folder cannot be written.

    Cancellation: a checkpoint while opening (a cancelled open leaves an old shard whole);
    exit flushes every accepted outcome and releases the lock, shielded.
    """
    layout = shard_layout(output_dir, label)
    stamped = list(RowStamper(run_id).all(rows))  # refused rows: before a file is touched
    if not stamped:
        raise ConfigError(f"shard {label!r} has no rows; a batch records at least one rollout")
    settings = shard_config(config, deployment, layout)
    async with open_run_folder(
        settings, deployment, plan=MaterializedRows(stamped), run_id=run_id
    ) as run:
        await run.store.reserve([(row.identity, 0) for row in stamped])
        yield Shard(layout, run.store, stamped, run_id)
