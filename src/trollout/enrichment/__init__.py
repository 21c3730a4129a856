"""Rollout enrichment: the model calls that served a rollout, its trajectory, its figures.

What: with observability on (``+observability_enabled=true +model_call_capture_dir=DIR``), the
deployment's model servers append one line per model call to ``DIR/<key>.capture.jsonl``,
where ``key`` is the rollout's capture key (``_ng_rollout_id`` or ``task-rollout``, plus
``-aN`` for attempt N > 0). After a rollout lands, and before its outcome is written, the
collector reads that file and adds three keys to the row, as NeMo Gym 0.7.0 does
(docs/enrichment.md is the contract, in our words):

- ``ng_model_call_capture``: one record per captured call (metadata; bodies removed once the
  trajectory holds them), sums, and gap markers for missing or damaged evidence;
- ``ng_trajectory``: the canonical TrajectoryRecord, projected from the agent's own trajectory
  or observation bundle and the captured calls;
- ``ng_perf``: turns, tool calls, token sums and coverage, and the collector's own wall clock.

With observability off, only an agent's own ``ng_trajectory`` / ``ng_agent_observations`` is
projected (NeMo Gym does that too), and nothing is read.

Why this shape:

- **Missing evidence is data, never a failure.** No file, a damaged line, an incomplete
  marker, a refused file, a cancelled read: each is the reference's gap marker on the row.
  Nothing is guessed (a sum over no values is null, a key without evidence is absent), and a
  rollout that landed stays landed. Harness output and reward are never touched: the
  enriched result shares every other value with the reply.
- **Hostile files are refused by construction** (`capture`): the name is built from the
  rollout's own validated key and opened relative to the capture dir with ``O_NOFOLLOW``, so
  no path, symlink or hard link leads to another file; size is capped before reading.
- **Never blocking the event loop.** Reads and deletions run in a worker thread
  (`trio.to_thread`); the only waits are `trio.sleep`, bounded by ``wait_s``, while a last
  line is still being written (a line without its newline: the writer is mid-append). An
  incomplete marker is reported, not waited on: it means a write failed.
- **The pure core is separate** (`enrich_result`): the engine, the front ends, the tests that
  replay NeMo Gym's runs and the bench all use the same function.
- **A leaf-level package**: it imports only `errors`, `records` and the leaf package
  `settings` (whose `enrichment_problem` is the one rule of the four settings, shared with
  `RunConfig`), and trio, orjson, attrs; the collector imports it, never the reverse.
  Settings reach it as `EnrichmentOptions`.

Rejected alternatives: enriching in the writer (one task for every pool: a slow capture read
would stall every sink; a worker already waits for its rollout, so the read costs nothing
extra there); enriching at aggregation time, after the run (captures may be deleted or
overwritten by the next run sharing the dir, and recorded shards would differ from what
collection records); waiting whenever a capture file is absent (NeMo Gym's model server makes a
line durable before the client has its response, so absence after ``/run`` returned means no
call was captured, and waiting would delay every rollout of a deployment without capture).
"""

from __future__ import annotations

from .calls import CAPTURE_KEY, call_record, capture_record
from .capture import CAPTURE_SUFFIX, INCOMPLETE_SUFFIX, CaptureFile, delete_capture, read_capture
from .enricher import (
    DEFAULT_MAX_CAPTURE_BYTES,
    DEFAULT_WAIT_S,
    ENRICHMENT_KEYS,
    Enricher,
    EnrichmentOptions,
    enrich_result,
    task_id_of,
)
from .perf import PERF_KEY, perf_record
from .trajectory import OBSERVATIONS_KEY, TRAJECTORY_KEY, project

__all__ = [
    "CAPTURE_KEY",
    "CAPTURE_SUFFIX",
    "DEFAULT_MAX_CAPTURE_BYTES",
    "DEFAULT_WAIT_S",
    "ENRICHMENT_KEYS",
    "INCOMPLETE_SUFFIX",
    "OBSERVATIONS_KEY",
    "PERF_KEY",
    "TRAJECTORY_KEY",
    "CaptureFile",
    "Enricher",
    "EnrichmentOptions",
    "call_record",
    "capture_record",
    "delete_capture",
    "enrich_result",
    "perf_record",
    "project",
    "read_capture",
    "task_id_of",
]
