"""A Ray run's plan, cut once on the driver into its blocks' run folders.

The driver plans the input once (`collector.planning.plan_rollouts`: every row checked,
numbered and seeded as one machine does) and writes every block's run folder before it hands
any out (`write_blocks`): each task goes to block ``task index % B``, every row of the task
with it (its repeats, its agents), in the plan's dispatch order. One pass over the plan's
bodies writes the B materialized-inputs files at once (each atomically and fsynced, its SHA-256
taken from the bytes as they are written), then each block's manifest, which names that file
as the block's input, as a trainer's batch recorded as a shard does (`recovery.run_folder`):
a block is the run of exactly its rows. Its settings are `block_config`'s, the same when the
folder is written and whenever it is handed out, so every hand-out, the first included,
resumes its folder (`trollout.run.collect` with ``resume_from_cache``): it checks and reads its
own rows, never the input, and plans nothing.

Memory: one open file (a 1 MiB write buffer) per block during the pass, and the set of task
indices each block holds (to count its tasks), never the rows.

Design note. Rejected: every block planning the whole input as shard ``b/B`` (what this
replaced): B parses and hashes of the whole input per run, most of Ray's CPU per rollout on a
warm cluster. Rejected: rows through Ray's object store (the whole materialized input held at
once on the driver and in the store, and a lost hand-out's rows sent again), or byte ranges of
one shared materialized file (a block would not be a run folder of its own that resume and
status understand). Round-robin by task index rather than `task_selection.task_shard`'s
content hash: the cut is made once and saved with the run, so stability under edits of the
input buys nothing, and round-robin gives blocks of equal size where a hash leaves some larger
and some empty.
"""

from __future__ import annotations

import hashlib
import os
from contextlib import ExitStack
from pathlib import Path

import attrs

from ... import jsonl
from ...collector.deployment.discovery import Deployment
from ...collector.planning.plan import Plan
from ...records.keys import TASK_INDEX
from ...recovery.files import atomic_write, os_errors
from ...recovery.layout import RunLayout
from ...recovery.manifest import build_manifest, write_manifest
from ...recovery.preflight import check_run_paths
from ...settings import RunConfig
from ..layout import shard_output, shards_root

__all__ = ["block_config", "write_blocks"]


def block_config(config: RunConfig, output: str | os.PathLike[str], block: int) -> RunConfig:
    """Return block ``block``'s own settings in the run whose settings are ``config`` (B
    fixed) and output ``output``: its folder, its rows as its input, always resumed."""
    assert config.ray_blocks is not None
    block_output = shard_output(output, block, config.ray_blocks)
    return attrs.evolve(
        config,
        input_jsonl_fpath=str(RunLayout.for_output(block_output).materialized_inputs),
        output_jsonl_fpath=str(block_output),
        shard=None,
        resume_from_cache=True,
        overwrite=False,
        disable_aggregation=True,
        require_complete=False,
        batch_manifest_fpath=None,
        max_run_time_s=None,
        ray_address=None,
        ray_workers=None,
        ray_blocks=None,
    )


def write_blocks(config: RunConfig, output: Path, plan: Plan, deployment: Deployment) -> list[int]:
    """Write every block's materialized inputs and manifest (blocking: a worker thread);
    return the rollouts of each block.

    Raises:
        RunFolderError: a block folder is not a place to write (`check_run_paths`), or a
            file cannot be written.
        InputError: the input changed since it was planned.
    """
    assert config.ray_blocks is not None
    blocks = config.ray_blocks
    configs = [block_config(config, output, b) for b in range(blocks)]
    layouts = [RunLayout.for_output(c.output_jsonl_fpath or "") for c in configs]
    for layout in layouts:
        layout.output.parent.mkdir(parents=True, exist_ok=True)
        check_run_paths(layout)
    digests = [hashlib.sha256() for _ in range(blocks)]
    counts = [0] * blocks
    tasks: list[set[int]] = [set() for _ in range(blocks)]
    with (
        os_errors(shards_root(output), "write the blocks' materialized inputs in"),
        ExitStack() as stack,
    ):
        files = [
            stack.enter_context(atomic_write(layout.materialized_inputs)) for layout in layouts
        ]
        for body in plan.bodies():
            task = int(body[TASK_INDEX])
            block = task % blocks
            line = jsonl.dumps(body)
            files[block].write(line)
            digests[block].update(line)
            counts[block] += 1
            tasks[block].add(task)
    for block, layout in enumerate(layouts):
        manifest = build_manifest(
            configs[block],
            deployment,
            input_sha256=digests[block].hexdigest(),
            expected=counts[block],
            tasks=len(tasks[block]),
        )
        write_manifest(layout, manifest)
    return counts
