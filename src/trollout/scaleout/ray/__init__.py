"""A run on a Ray cluster: the driver hands blocks of the plan out to workers as they free up.

- `driver`: ``collect --ray`` in the ``trollout`` process (plan once, manifest, merge at the end);
- `rows`: the plan cut into the blocks' run folders, once, on the driver;
- `handout`: the queue of blocks, the driver's watchers (signals, deadline), the summed progress;
- `merge`: the end of a run: completeness, the merge into OUT, rows in against rows out;
- `telemetry`: the run's one trace and summed metrics, on the driver (loaded only when asked);
- `block`: what runs on a worker (one block through `trollout.run.collect`), streaming its
  progress to the driver and reading the driver's stop file.

These are the only modules that import Ray. Nothing imports this package but the command line,
lazily (`trollout.cli.scaleout.collect_any`), so ``import trollout`` and a plain ``trollout
collect`` never load Ray; this ``__init__`` imports nothing, so the rule holds for the package too.
"""
