"""Recording a batch as a shard: a run folder per training step that the CLI resumes.

Part of the run layer (the front ends call it, `trollout.frontends.rollouts`): a shard is a run,
opened by the same folder opening as `collect`'s (`open_run_folder`), resumed and shown by the
same `resume` and `status`.

A shard labelled ``L`` in folder ``D`` is the run folder of ``D/rollouts-L.jsonl``, opened with
`recovery.run_folder.open_run_folder` like any run: the batch's stamped rows are its
materialized inputs (and its input: the manifest names that file, so ``trollout resume
D/rollouts-L.jsonl`` checks and dispatches exactly those rows), and the manifest carries the
batch's run id and the deployment. Attempt numbers are reserved as in any run: by the worker,
right before its request leaves (`collector.pool`), so a row the batch never sends spends none.
The folder's lock is held while the batch runs, and the store checks before each write that it
is still the folder's writer (`recovery.lock.RunLock.verify`), so two writers never interleave.
Opening a label again replaces what the label held, once the new inputs are complete on disk (a
replayed step never duplicates rows).

Rows never started leave a trace. A batch cut early (the consumer left the block, closed it,
stopped admission, or the budget closed the window) never starts some rows; when the batch has
closed, the shard settles each row that has no outcome as drained (`records.Omitted`, reason
``drained``, attempt 0: nothing was sent), before the folder closes. So the shard's status
counts them (``not_started``; ``finished`` only when every row has an outcome), lists each
(kind ``drained``), and with ``record_omitted_rollouts`` the sidecar holds NeMo Gym's
omitted-rollout row for each (``_ng_omitted_rollout``, ``_ng_dispatch_drained``), as NeMo Gym's
``_RunRecordWriter`` writes a never-started try. ``trollout resume`` of the shard runs them,
``trollout status`` counts them as never started, and ``trollout aggregate`` as missing.
Rejected: reserving every row's first attempt when the shard opens (what this replaced: a row
never sent kept a reserved number and read as possibly sent), and leaving the rows unrecorded
(the status then summed to fewer rows than the shard holds while saying it had finished).

A shard resumes by NeMo Gym's recipe too: ``trollout collect
+input_jsonl_fpath=D/rollouts-L_materialized_inputs.jsonl +output_jsonl_fpath=D/rollouts-L.jsonl
+resume_from_cache=true`` (with the deployment) runs what the shard still lacks, as ``gym eval
run`` does. For that the shard's manifest is the one that recipe computes (NeMo Gym's
``_RunRecordWriter`` records the same): its input is its materialized inputs, and every plan
setting (`RunConfig.planned_as_is`: ``num_repeats``, ``agent_name``, ``agent_map``, ``fan_out``,
seeds, routing, ...) is at its default, because planning the shard's rows with the defaults is
the identity: each row already carries its task and rollout index, its agent and its seed, and
the planner keeps them. The batch's own plan settings shaped rows that are now the input; they
plan nothing more. What still guards a resume is unchanged: the materialized file's sha256 (a
changed row is refused, one line), the deployment's agent set, and the plan settings compared
with the defaults, so a resume that asks for another plan (``+num_repeats=4`` over the shard's
rows) is refused rather than silently run as recorded. ``trollout resume`` reads the same
manifest and behaves as before.
Rejected: skipping the comparison of plan settings whenever the input rows carry identity stamps
(the other reading of "planning is the identity"). It needs the resume to read and judge the
input's rows, and it would run a resume given ``+num_repeats=4`` as recorded, a setting taken in
silence; NeMo Gym refuses that resume, and so does a manifest that records the defaults.
Rejected too: a special case for the recipe in the manifest check; the manifest should say what
the shard is, and every resume (the recipe, ``resume``, a Store's) then checks one thing.

Shards of a training run aggregate without collisions: every rollout id carries its shard's run
id (`collector.batch.shard_rollout_id`), so step 3's task 0 is never step 4's task 0.

Rows are stamped once: `open_shard` copies and stamps them (`RowStamper.stamp_all`, refusing a
repeated (task, rollout) before a file is touched), writes those copies as the materialized
inputs, and the front end opens the batch on `Shard.rows` (`StampedRows` of the batch's run
id), so the batch dispatches, and hands the consumer, the very copies recorded
(`collector.engine.run_ids` says why). After the batch opens, the shard reads only the rows'
identities (`settle_never_started`), never their bodies, which belong to the consumer once
delivered.
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import attrs
import trio

from ..collector.deployment.discovery import AGENTS, Deployment
from ..collector.engine.batch import BatchRows, RowStamper, StampedRows
from ..errors import ConfigError, TrolloutError
from ..records import MaterializedRow, OmitReason, Omitted
from ..recovery.layout import AUXILIARY_SUFFIXES, RunLayout
from ..recovery.run_folder import MaterializedRows, open_run_folder
from ..recovery.store import RunStore
from ..settings import RunConfig

__all__ = ["SHARD_LABEL", "Shard", "open_shard", "settle_never_started", "shard_layout"]

SHARD_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@attrs.frozen
class Shard:
    """An open shard: its store (the batch's sink) and the rows it records: the stamped
    copies, which a batch of ``run_id`` dispatches as they are (`StampedRows`)."""

    layout: RunLayout
    store: RunStore
    rows: StampedRows
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
    """Return the settings a shard is recorded (and later resumed) with: NeMo Gym's resume
    recipe's (module docstring), with the deployment the batch ran against."""
    where: dict[str, Any]
    if deployment.head_url is not None:
        where = {"head_server": deployment.head_url, "agent_urls": {}}
    else:
        agents = {s.name: s.url for s in deployment.servers if s.server_type == AGENTS}
        where = {"agent_urls": agents}
    return attrs.evolve(
        config.planned_as_is(),  # the recipe's settings (module docstring)
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

    Cancellation: a checkpoint while opening, first of all before the folder is touched (an
    open in a cancelled scope creates nothing; one cancelled later leaves an old shard whole);
    exit settles the rows that never started (module docstring), flushes every accepted
    outcome and releases the lock, shielded.
    """
    layout = shard_layout(output_dir, label)
    stamped = RowStamper(run_id).stamp_all(rows)  # refused rows: before a file is touched
    if not stamped:
        raise ConfigError(f"shard {label!r} has no rows; a batch records at least one rollout")
    settings = shard_config(config, deployment, layout)
    # Entering is a checkpoint, taken before the folder (its lock file included) is touched:
    # a batch opened in a cancelled scope leaves the disk as it was.
    await trio.lowlevel.checkpoint_if_cancelled()
    async with open_run_folder(
        settings, deployment, plan=MaterializedRows(stamped), run_id=run_id
    ) as run:
        try:
            yield Shard(layout, run.store, stamped, run_id)
        except BaseException:
            with trio.CancelScope(shield=True), suppress(TrolloutError):  # the first error wins
                await settle_never_started(run.store, stamped)
            raise
        await settle_never_started(run.store, stamped)


async def settle_never_started(store: RunStore, rows: Sequence[MaterializedRow]) -> int:
    """Settle every row of a closed batch that has no outcome as drained; return how many.

    Raises:
        RunFolderWriteError: the shard cannot be written.
    """
    never = [Omitted(r.identity, 0, OmitReason.DRAINED, 0.0) for r in rows]
    never = [outcome for outcome in never if not store.has_outcome(outcome.identity)]
    if never:
        await store.write(never)
    return len(never)
