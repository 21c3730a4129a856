"""Front ends for training loops: batches on a long-lived collector, in Trio, asyncio or threads.

- `rollouts`: `open_rollouts` / `Rollouts`, the Trio API (batches, planning, shard recording);
- `shards`: a batch recorded as a resumable run folder;
- `bridge`, `aio`, `sync`: the same object run in a Trio thread, for asyncio and blocking callers.
"""
