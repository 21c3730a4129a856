"""`Enricher`: the per-rollout step the collector's workers await, and its pure core.

`enrich_result` is the whole transformation, pure and synchronous (the tests and the bench call
it directly). `Enricher.__call__` adds the I/O around it: the capture read in a worker thread,
the bounded wait for a last line still being written, the deletion of a merged file.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any, Final

import attrs
import trio
from attrs import frozen

from ..errors import CaptureFileError, ConfigError
from ..records import Identity, Landed, is_mapping
from ..settings import enrichment_problem
from .calls import CAPTURE_KEY, PAYLOAD_KEYS, capture_record, gap
from .capture import CaptureFile, delete_capture, read_capture
from .perf import PERF_KEY, perf_record
from .trajectory import OBSERVATIONS_KEY, TRAJECTORY_KEY, project

__all__ = [
    "DEFAULT_MAX_CAPTURE_BYTES",
    "DEFAULT_WAIT_S",
    "ENRICHMENT_KEYS",
    "Enricher",
    "EnrichmentOptions",
    "enrich_result",
    "task_id_of",
]

DEFAULT_MAX_CAPTURE_BYTES: Final = 64 * 1024 * 1024  # one rollout's capture, at most
DEFAULT_WAIT_S: Final = 2.0  # the longest wait for a last line still being written
ENRICHMENT_KEYS: Final = (TRAJECTORY_KEY, CAPTURE_KEY, PERF_KEY)
_TASK_ID_FIELDS: Final = ("task_id", "problem_id", "instance_id")
_log = logging.getLogger(__name__)


@frozen
class EnrichmentOptions:
    """What enrichment does (the four settings, plus its bounds).

    Attributes:
        observability: ``observability_enabled``: merge captures and assemble ``ng_perf``;
            off, only an agent's own trajectory is projected (as NeMo Gym does).
        capture_dir: ``model_call_capture_dir``, absolute; required when observability is on.
        include_payloads: ``include_model_call_payloads``: keep request/response bodies in
            the trajectory's model calls (False: call metadata only).
        delete_capture: ``delete_model_call_capture``: remove a capture file once merged;
            needs payloads kept (a deleted file's bodies would be gone for good).
        max_capture_bytes: the largest capture file read for one rollout.
        wait_s: the longest wait for a last line still being written.

    Raises:
        ConfigError: the settings contradict each other (naming the key and the remedy).
    """

    observability: bool = False
    capture_dir: str | None = None
    include_payloads: bool = True
    delete_capture: bool = False
    max_capture_bytes: int = DEFAULT_MAX_CAPTURE_BYTES
    wait_s: float = DEFAULT_WAIT_S

    def __attrs_post_init__(self) -> None:
        problem = enrichment_problem(
            self.observability, self.capture_dir, self.include_payloads, self.delete_capture
        )
        if problem is not None:
            raise ConfigError(problem)
        if self.max_capture_bytes < 1 or not (0 <= self.wait_s < math.inf):
            raise ConfigError(
                f"EnrichmentOptions: max_capture_bytes must be >= 1 and wait_s a finite number "
                f">= 0 (got {self.max_capture_bytes!r}, {self.wait_s!r})"
            )


def task_id_of(row: Mapping[str, Any] | None, identity: Identity) -> str:
    """Return the trajectory's ``task_id``: the row's task id field, else the task index."""
    if row is not None:
        for name in _TASK_ID_FIELDS:
            value = row.get(name)
            if isinstance(value, str | int) and not isinstance(value, bool):
                return str(value)
            if is_mapping(value) and isinstance(value.get("task_id"), str | int):
                return str(value["task_id"])  # a 0.7.0 task row's {taskset, task_id}
    return str(identity.task_index)


def enrich_result(
    result: Mapping[str, Any],
    *,
    key: str,
    task_id: str,
    observability: bool,
    capture: CaptureFile | None = None,
    refused: str | None = None,
    include_payloads: bool = True,
    latency_ms: float | None = None,
) -> Mapping[str, Any]:
    """Return ``result`` with ``ng_model_call_capture``, ``ng_trajectory``, ``ng_perf``.

    Pure: ``result`` is not changed; the returned mapping shares every other value with it
    (harness output and reward are the same objects). Off (``observability`` False) and with
    no agent trajectory or observations, ``result`` itself is returned.

    Args:
        key: the rollout's capture key.
        task_id: the trajectory's task id (`task_id_of`).
        capture: what the read found (None: nothing read).
        refused: why the capture could not be read (a gap ``model_call_capture_unreadable``).
        latency_ms: the collector's own wall clock of the rollout (``ng_perf.total_latency_ms``).
    """
    if not observability and TRAJECTORY_KEY not in result and OBSERVATIONS_KEY not in result:
        return result
    out = dict(result)
    if is_mapping(out.get(OBSERVATIONS_KEY)):
        bundle = dict(out[OBSERVATIONS_KEY])
        if isinstance(bundle.get("records"), list):
            bundle["records"] = [dict(r) if is_mapping(r) else r for r in bundle["records"]]
        out[OBSERVATIONS_KEY] = bundle
    record: dict[str, Any] | None = None
    if observability:
        read_gaps = []
        if refused is not None:
            read_gaps.append(gap("model_call_capture_unreadable", refused))
        if capture is not None and capture.incomplete:
            read_gaps.append(gap("model_call_capture_incomplete"))
        exchanges = capture.exchanges if capture is not None else ()
        record = capture_record(key, exchanges, read_gaps, include_payloads)
    calls = record["calls"] if record is not None else []
    valid = False
    try:
        trajectory, valid = project(
            out,
            task_id=task_id,
            rollout_id=key,
            calls=calls,
            capture_gaps=record.get("gaps", []) if record is not None else [],
        )
    except Exception as exc:  # a bug or an input we did not foresee: a gap, never a failure
        failed = {"code": "trajectory_projection_failed", "detail": type(exc).__name__}
        if record is not None:
            record.setdefault("gaps", []).append(failed)
        else:
            out[TRAJECTORY_KEY] = _minimal(task_id, key, failed)
    else:
        out[TRAJECTORY_KEY] = trajectory
        if record is not None:
            for call in calls:  # the trajectory's model calls own the bodies now
                for payload in PAYLOAD_KEYS:
                    call.pop(payload, None)
    if record is not None:
        out[CAPTURE_KEY] = record
        if valid:  # ng_perf only from a trajectory that validated, with an invocation
            perf = perf_record(out[TRAJECTORY_KEY], latency_ms)
            if perf is not None:
                out[PERF_KEY] = perf
    return out


def _minimal(task_id: str, key: str, failed: dict[str, Any]) -> dict[str, Any]:
    return {
        "schema_version": "1.0",
        "task_id": task_id,
        "rollout_id": key,
        "invocations": [],
        "turns": [],
        "model_calls": [],
        "tool_calls": [],
        "gaps": [{"code": failed["code"], "invocation_id": None, "detail": failed["detail"]}],
    }


class Enricher:
    """The collector's per-rollout enrichment (`collector.engine.pool.Enrich`).

    Awaited by a worker after its rollout landed and before the outcome is handed to the
    writer; a failed or omitted rollout is never enriched (NeMo Gym enriches only a ``/run``
    that returned a result). Never raises for what it reads: every problem is a gap.
    """

    def __init__(self, options: EnrichmentOptions) -> None:
        self.options = options

    def _fields(self, outcome: Landed, row: Mapping[str, Any] | None) -> dict[str, Any]:
        elapsed = outcome.elapsed_seconds
        return {
            "key": outcome.identity.rollout_id_for(outcome.attempt_index),
            "task_id": task_id_of(row, outcome.identity),
            "observability": self.options.observability,
            "include_payloads": self.options.include_payloads,
            "latency_ms": None if elapsed is None else elapsed * 1000.0,
        }

    def wants(self, outcome: Landed) -> bool:
        """Whether there is anything to do for this outcome (no I/O, no checkpoint)."""
        result = outcome.result
        return self.options.observability or TRAJECTORY_KEY in result or OBSERVATIONS_KEY in result

    async def __call__(self, outcome: Landed, row: Mapping[str, Any] | None = None) -> Landed:
        """Return the outcome enriched (the same object when there is nothing to do).

        Cancellation: a checkpoint while reading or waiting; if cancelled, nothing was changed
        and the caller settles the outcome with `interrupted`.
        """
        if not self.wants(outcome):
            return outcome
        fields = self._fields(outcome, row)
        capture: CaptureFile | None = None
        refused: str | None = None
        if self.options.observability:
            capture, refused = await self._read(fields["key"])
        try:
            result = enrich_result(outcome.result, capture=capture, refused=refused, **fields)
        except Exception as exc:  # never a failed rollout
            _log.warning("enrichment of rollout %s failed: %r", fields["key"], exc)
            return outcome
        if self.options.delete_capture and capture is not None and capture.exists:
            try:
                directory = self.options.capture_dir or ""
                await trio.to_thread.run_sync(delete_capture, directory, fields["key"])
            except CaptureFileError as exc:
                _log.warning("%s", exc)
        return attrs.evolve(outcome, result=result)

    async def before(self, identity: Identity, attempt: int) -> None:
        """Clear the attempt's capture key before it is sent, as NeMo Gym's collector does.

        A capture dir shared across runs keeps files under reused keys (``0-0``...); a stale
        file would be merged into this rollout. Only this attempt's two names are removed.
        Off: nothing (no checkpoint).
        """
        if not self.options.observability:
            return
        key = identity.rollout_id_for(attempt)
        try:
            await trio.to_thread.run_sync(delete_capture, self.options.capture_dir or "", key)
        except CaptureFileError as exc:
            _log.warning("%s", exc)

    def interrupted(self, outcome: Landed, row: Mapping[str, Any] | None = None) -> Landed:
        """Return the outcome as recorded when enrichment was cancelled (no I/O).

        With observability on, the capture is marked unread (gap
        ``model_call_capture_unreadable``); the agent's own trajectory is still projected.
        """
        if not self.wants(outcome):
            return outcome
        try:
            result = enrich_result(
                outcome.result,
                refused="the run was cancelled before the capture was read",
                **self._fields(outcome, row),
            )
        except Exception:
            return outcome
        return attrs.evolve(outcome, result=result)

    async def _read(self, key: str) -> tuple[CaptureFile | None, str | None]:
        """Read the capture, waiting (bounded) while its last line is still being written."""
        options = self.options
        assert options.capture_dir is not None
        deadline = trio.current_time() + options.wait_s
        delay = 0.01
        while True:
            try:
                found = await trio.to_thread.run_sync(
                    read_capture, options.capture_dir, key, options.max_capture_bytes
                )
            except CaptureFileError as exc:
                return None, str(exc)
            now = trio.current_time()
            if not found.partial_tail or now >= deadline:
                return found, None
            await trio.sleep(min(delay, deadline - now))
            delay = min(delay * 2, 0.25)
