"""One eval on many machines: shard folders, Slurm array scripts, and Ray (`ray`).

A distributed run is one plan cut into N shards by `collector.task_selection.task_shard`
(``--shard I/N``): every shard plans the whole input, so task indices and seeds are those of a
single machine, and keeps the tasks whose identity hashes to it. Each shard is an ordinary run
folder (manifest, ledger, lock: everything `recovery` gives one machine), under the run's
``<stem>_shards/`` folder (`layout`), and ``trollout aggregate`` merges them into one run by the
rollouts' identity across runs (`metrics.identity`).

- Slurm (`sbatch`): a generated array script; each job is ``collect --shard $ID/N --resume``.
- Ray (`ray`: driver, handout, block): blocks of tasks handed out to workers as they free up;
  the only modules that import Ray, reached only by the command line, lazily.

Nothing outside `ray` imports Ray: ``import trollout`` and the plain command line never do.
"""

from __future__ import annotations

from .layout import ShardFolder, check_shards_root, shard_folders, shard_output, shards_root

__all__ = ["ShardFolder", "check_shards_root", "shard_folders", "shard_output", "shards_root"]
