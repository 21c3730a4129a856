"""The engine: one collector, its pools and batches, and the single writer.

`collector.open_collector` owns one nursery, the shared `trio.CapacityLimiter` and the writer
task; a `pool.Pool` lends rows to at most ``max_resident_rollout_tasks`` workers, each of which
dispatches (`..dispatch`) and hands its outcome to the writer, which updates `progress`,
`timing`, the run-level `stops` and the `observer`, and writes through the `sink` it was given.
`batch` is a pool opened by a training loop (`Collector.open_batch`). `window` decides
admission (budget, drain margin, stops); `queues` samples model-server queues for timing.
The parts meet through narrow protocols (`pool.PoolHost`, `batch.BatchHost`), so pool and batch
never import the collector.
"""
