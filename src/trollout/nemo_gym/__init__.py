"""NeMo Gym's ``RolloutCollectionHelper`` on trollout: a script changes its imports, nothing else.

A trainer written against NeMo Gym 0.7.0's direct collection API::

    from trollout.nemo_gym import BaseServerConfig, RolloutCollectionHelper

    helper = RolloutCollectionHelper()
    rows = helper.preprocess_examples(examples, agent_map={...}, num_repeats=4)
    completions = helper.run_examples(rows, head_server_config=BaseServerConfig(host=h, port=p))
    try:
        for future in completions:          # awaitables, resolving in completion order
            row, result = await future
            if should_stop(row, result):
                break
    finally:
        await completions.aclose()

runs under ``asyncio.run`` against the same deployment and gets the same ``(row, result)``
pairs, each rollout dispatched by trollout's engine: exactly once per accepted row, with its
limiter, retry policy, attempt ledger and (``record_output_dir`` + ``record_shard``) a shard
``trollout resume`` resumes. docs/nemo-gym.md is the user's page: every method, every parameter,
and each place this differs from NeMo Gym.

What it is built on. Only trollout's public API: `trollout.aio.open_rollouts` (the asyncio front
end, which runs the collector in a Trio thread of its own), the names ``trollout/__init__.py``
exports (`discover`, `Deployment`, `plan_rows`, `RunConfig`, the outcome records and
`outcome_to_row`), and `trollout.errors`. No collector, front-end or run-folder module is
imported, so the engine's internals can move without touching this package.

The shape (`completions.RowResultIterator`). ``run_examples`` and ``run_outcomes`` return at
once, having checked their arguments (nothing is dispatched, no thread started). The first
awaitable awaited opens a session: the deployment is discovered (once per helper with
``reuse_server_client``), then an `AioRollouts` and one batch of the rows are opened, with this
call's settings (concurrency from ``semaphore``/``max_resident_tasks``, ``dispatch_budget_s``
counted from the call, ``retry_requests``...). One pump task moves the batch's outcomes into a
queue the awaitables share: each awaitable, whichever is awaited first, takes the earliest
outcome not yet taken, so outcomes come in completion order, as with ``asyncio.as_completed``,
and an outcome is handed to exactly one awaitable. When the batch ends by itself the session
closes (the shard is complete on disk and unlocked) before the last pair is returned.
``aclose()`` closes the batch (trollout's close: rows not started never start, rollouts in
flight are cancelled, every accepted rollout reaches its sink) and wakes the awaitables with
nothing claimed, which raise ``CancelledError``; ``aclose_and_drain()`` closes the same way
and returns settled futures for what had settled and was not yet taken.

Design notes.

- A session per call, not per helper. NeMo Gym's helper has no close, so a helper holding a
  collector thread would leave it to the interpreter's exit; per call, every thread started is
  joined by the call's own end (its last outcome, ``aclose`` or ``aclose_and_drain``). The cost
  is one thread start and one connection pool per call (bench/frontends.py measures the
  drop-in against `trollout.aio` on the same batches). ``reuse_server_client`` keeps what
  NeMo Gym's keeps: the deployment's configuration, fetched once.
- One pump, not awaitables that each read the batch: two readers of the asyncio front end's
  queue could leave one waiting for a message the other took; the pump is the only reader
  and cancelling it loses nothing (a message not read stays in the queue).
- Failures. A failed ``/run`` raises `RolloutRequestError` from its awaitable unless
  ``route_failures_to_sidecar`` (then the pair's result is the typed failure row), as NeMo
  Gym raises or routes; ``run_outcomes`` returns the typed record (`trollout.Failed`). A row
  the dispatch budget never started resolves to NeMo Gym's drained result (class
  ``cancelled``, ``_ng_dispatch_drained``, ``_ng_no_persist``).
- Rejected: re-implementing NeMo Gym's two completion iterators (eager and bounded) over raw
  asyncio tasks posting ``/run`` themselves. That is NeMo Gym again, without trollout's
  exactly-once engine, which is the reason to switch.
- ``retry_requests`` keeps NeMo Gym's default, True: a ``/run`` that may have reached the
  server is sent again (as a new attempt, on the ledger). That can run a mutating rollout
  twice; pass ``retry_requests=False`` (trollout's own default) for environments with side
  effects. docs/nemo-gym.md says so where the parameter is described.
- Enrichment is the engine's own (`trollout.enrichment`, as collection enriches): the call's
  batch is opened with ``enrich_results`` (implied by ``record_shard``), and the helper's
  config says whether capture files are read (``observability_enabled``,
  ``model_call_capture_dir``), as NeMo Gym's global config does. Off, the batch attaches
  nothing, so results are exactly ``/run``'s replies even with observability on.
"""

from __future__ import annotations

from .completions import RowResultIterator
from .constants import *  # noqa: F403 (the reference's public constants, by name)
from .constants import __all__ as _constants
from .helper import DEFAULT_HEAD_SERVER, BaseServerConfig, RolloutCollectionHelper

__all__ = [
    "DEFAULT_HEAD_SERVER",
    "BaseServerConfig",
    "RolloutCollectionHelper",
    "RowResultIterator",
    *_constants,
]
