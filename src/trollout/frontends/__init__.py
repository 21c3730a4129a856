"""Front ends for training loops: batches on a long-lived collector, in Trio, asyncio or threads.

- `rollouts`: `open_rollouts` / `Rollouts`, the Trio API (batches, planning; a batch recorded
  as a resumable run folder through the run layer, `trollout.run.shards`);
- `bridge`, `aio`, `sync`: the same object run in a Trio thread, for asyncio and blocking callers;
- `asyncio_agent`: an agent written for asyncio, run in process as the ``/run`` transport.

The public entry modules stay `trollout.aio` and `trollout.sync` (and `trollout.open_rollouts`);
this package is loaded lazily, so the command line never imports asyncio.

Design note. Shard recording moved to the run layer (`trollout.run.shards`): it opens a run
folder per batch through the same `open_run_folder` every run uses, and ``trollout resume``
continues it like any run, so it is the run's business, not a front end's. The asyncio agent
transport stays here: only embedding code uses it, always beside `open_rollouts`
(docs/embedding.md), never the engine or the command line, and it carries the trio-asyncio
import that this package already keeps away from ``import trollout``; in `collector/http` it
would put asyncio code inside the engine's package, whose transports are all sockets.
"""
