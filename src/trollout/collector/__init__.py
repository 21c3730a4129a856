"""The collector: everything between a run's rows and their outcomes, in five stages.

- `planning`: input rows to the rollouts of a run (`planning.plan.plan_rollouts`);
- `deployment`: which servers there are and where each agent's rollouts go;
- `engine`: the collector, its pools and batches, and the single writer;
- `dispatch`: one rollout's request loop and the retry policy;
- `http`: the HTTP/1.1 client that carries ``POST /run``;
- `classify`: a reply or an error to a `records.Landed` or `records.Failed`.

The collector writes to a sink it is given and is watched through one observer hook: it never
imports the run folder (`trollout.recovery`), telemetry or the command line
(docs/architecture.md, held by tests/test_layering.py).
"""
