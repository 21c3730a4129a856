"""Scripted faults for the fake deployment's ``/run``, chosen per request and deterministic.

A `Fault` says how one ``/run`` misbehaves. Which request gets which fault is decided, in this
order, by:

1. the row itself: a dataset field ``fake_fault`` (a fault mapping, optionally limited to some
   attempts with ``attempts: [0]`` and to some requests within an attempt with
   ``requests: [0, 1]``); for an episode request, inside ``task.task_input``, the only part of a
   task row an episode server receives;
2. the fault hook: a callable given to the deployment, ``fn(FaultContext) -> Fault | None``
   (`FaultFn`). It sees the server, the rollout's (task, rollout, attempt), the **index of the
   request within its attempt** (0 for the first; a 429 retried within the attempt is request 1,
   and so on), the run id a driver's batch stamped, and the request itself. `FaultScript` is
   such a hook read from a JSON Lines file, so the fake in its own process
   (``python -m trollout.testing serve --fault-script FILE``, `spawn_fake_deployment`'s
   ``fault_script``) follows a script a test writes; the file is re-read when it changes;
3. the server's `FaultPlan` (an agent's or episode server's own, else the deployment's for agent
   and legacy environment servers): a pure function of (task, rollout, attempt), so a test can
   compute exactly which rollouts got which fault by calling `FaultPlan.fault_for` itself.

The ``episode_*`` kinds are how an episode environment server (docs/protocol.md section 3) answers
or misbehaves; only episode servers apply them. `EPISODE_VARIANTS` lists each one's
``variant`` values.

Design note: the plan hashes its inputs with BLAKE2b instead of drawing from a seeded
``random.Random``, because a stream of draws depends on the order requests arrive in, which
concurrency makes nondeterministic; a hash of the key does not.
"""

from __future__ import annotations

import enum
import hashlib
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
from attrs import field, frozen

from ..errors import ConfigError

__all__ = [
    "EPISODE_VARIANTS",
    "FAULT_FIELD",
    "REPORT_VARIANTS",
    "Fault",
    "FaultContext",
    "FaultFn",
    "FaultKind",
    "FaultPlan",
    "fault_from_dict",
    "plan_from_dict",
    "unit_hash",
]

FAULT_FIELD = "fake_fault"
ONE_MEGABYTE = 1024 * 1024


class FaultKind(enum.Enum):
    """How one ``/run`` misbehaves."""

    LATENCY = "latency"  # answer normally after an extra `delay_s`
    STATUS = "status"  # answer `status` with `body` (JSON string) and optional Retry-After
    RESET_MID_REQUEST = "reset_mid_request"  # read the request, then RST without a reply byte
    DISCONNECT = "disconnect"  # read the request, then close (FIN) without a reply byte
    RESET_MID_RESPONSE = "reset_mid_response"  # send the head and half the body, then RST
    HANG = "hang"  # never answer; hold the connection until the client leaves
    NOT_JSON = "not_json"  # 200 whose body is not JSON
    NOT_OBJECT = "not_object"  # 200 whose body is JSON but not an object
    OVERSIZED = "oversized"  # `status` (default 500), a `size`-byte body made as it is sent
    SLOWLORIS = "slowloris"  # 200, then a body of one byte every `interval_s`, never ending
    UNSOLICITED_REPLY = "unsolicited_reply"  # answer, then `interval_s` later one more reply
    FAILURE_CLASS = "failure_class"  # 200 with `_ng_failure_class` (+ `_ng_failure_terminal`)
    NO_PERSIST = "no_persist"  # 200 with `_ng_no_persist: true` (kill-shaped)
    JUDGE_FAILED = "judge_failed"  # 200, reward 0.0, masked, `_ng_failure_class: judge_failed`
    MASKED = "masked"  # 200 success with `mask_sample: true` and a failure_kind
    # Episode servers only (docs/protocol.md section 3):
    EPISODE_FAILURE = "episode_failure"  # a `failure` (terminal, failure_kind, stage, partial)
    EPISODE_SHAPE = "episode_shape"  # a reply of another shape (`variant`)
    EPISODE_COLLECTOR_KEYS = "episode_collector_keys"  # a result using collector keys (`variant`)
    EPISODE_IDENTITY = "episode_identity"  # echoes another episode's identity (`variant`)


EPISODE_KINDS = frozenset(
    {
        FaultKind.EPISODE_FAILURE,
        FaultKind.EPISODE_SHAPE,
        FaultKind.EPISODE_COLLECTOR_KEYS,
        FaultKind.EPISODE_IDENTITY,
    }
)
EPISODE_VARIANTS: dict[FaultKind, tuple[str, ...]] = {
    FaultKind.EPISODE_SHAPE: (
        "array",  # a JSON array
        "string",  # a JSON string
        "null",  # JSON null
        "flat",  # a flat /run reply: responses_create_params, response, reward
        "no_episode_id",  # the result envelope without episode_id
        "no_task_id",  # ... without task_id
        "neither",  # episode_id and task_id, but neither result nor failure
        "both",  # both result and failure
        "result_not_object",  # result is a list
        "failure_not_object",  # failure is a string
        "bad_terminal",  # failure.terminal is the string "yes"
        "no_reason",  # failure without failure_reason
    ),
    FaultKind.EPISODE_COLLECTOR_KEYS: (
        "ng",  # the result carries `_ng_reward_override`
        "perf",  # ... `ng_perf`
        "capture",  # ... `ng_model_call_capture`
    ),
    FaultKind.EPISODE_IDENTITY: (
        "attempt",  # episode_id.attempt + 1
        "attempt_bool",  # episode_id.attempt as a boolean (true for 1, false for 0)
        "rollout_id",  # another rollout id
        "taskset",  # task_id.taskset changed
        "task_id",  # task_id.task_id changed
        "extra_key",  # episode_id with one more key
    ),
}
REPORT_VARIANTS = (
    "valid",  # an id and two events beside the reply
    "invalid",  # an ill-typed report (events is a string): the collector omits it
    "many",  # 40 events, 3 already omitted: the collector keeps 32 and counts 11 omitted
)


def _kind(value: FaultKind | str) -> FaultKind:
    if isinstance(value, FaultKind):
        return value
    try:
        return FaultKind(value)
    except ValueError:
        known = ", ".join(k.value for k in FaultKind)
        raise ConfigError(f"unknown fault kind {value!r}; use one of: {known}") from None


def _attempts(value: Iterable[int] | None) -> tuple[int, ...] | None:
    return None if value is None else tuple(int(v) for v in value)


@frozen(kw_only=True)
class Fault:
    """One scripted misbehaviour of ``/run`` (which fields matter depends on `kind`).

    Attributes:
        kind: what happens.
        status: HTTP status for STATUS and OVERSIZED.
        body: the error body for STATUS (sent as a JSON string, as Gym servers do); the
            failure reason for JUDGE_FAILED and MASKED; for UNSOLICITED_REPLY, the answer text
            of the extra reply (a forgery of the real one; None: the extra reply replays it).
        retry_after: a ``Retry-After`` header value in seconds (STATUS), or None.
        delay_s: extra seconds before answering (LATENCY; added to any kind).
        size: body size in bytes for OVERSIZED (any size: the body is never held whole).
        failure_class: the class for FAILURE_CLASS (optional for NO_PERSIST); the
            ``failure_kind`` for MASKED (default ``session_lost``).
        terminal: whether FAILURE_CLASS also sets ``_ng_failure_terminal: true``.
        attempts: only these attempt indices get the fault (row overrides); None means all.
        requests: only these requests within an attempt get it (row overrides; 0 is the
            attempt's first request); None means all.
        interval_s: SLOWLORIS: seconds between body bytes; UNSOLICITED_REPLY: seconds from the
            real reply to the extra one.
        until_eof: OVERSIZED: declare no length; the body runs until the connection closes.
        variant: the episode kinds' variant (`EPISODE_VARIANTS`; None: the first).
        stage: EPISODE_FAILURE: the failure's ``stage``.
        partial: EPISODE_FAILURE: the failure carries a ``partial_response``.
        report: a FailureReport beside an episode server's reply (`REPORT_VARIANTS`), or None.
        failure_kind: FAILURE_CLASS: the reply's ``failure_kind`` (``credentials_rejected``: its
            provider refused the credentials); STATUS: the kind the failure report in the
            reply's ``X-NG-Failure-Report`` header names, behind the agent's routing failure.

    For EPISODE_FAILURE, `failure_class` is the ``failure_kind`` (None: absent), `body` the
    ``failure_reason`` and `terminal` the failure's ``terminal``.
    """

    kind: FaultKind = field(converter=_kind)
    status: int | None = None
    body: str | None = None
    retry_after: float | None = None
    delay_s: float = 0.0
    size: int = ONE_MEGABYTE
    failure_class: str | None = None
    terminal: bool = False
    attempts: tuple[int, ...] | None = field(default=None, converter=_attempts)
    requests: tuple[int, ...] | None = field(default=None, converter=_attempts)
    interval_s: float = 0.005
    until_eof: bool = False
    variant: str | None = None
    stage: str | None = None
    partial: bool = False
    report: str | None = None
    failure_kind: str | None = None

    def __attrs_post_init__(self) -> None:
        variants = EPISODE_VARIANTS.get(self.kind, ())
        if self.variant is not None and self.variant not in variants:
            raise ConfigError(
                f"fault kind {self.kind.value!r} has no variant {self.variant!r}; "
                f"use one of: {', '.join(variants) or 'none (leave variant out)'}"
            )
        if self.report is not None and self.report not in REPORT_VARIANTS:
            raise ConfigError(
                f"fault report {self.report!r} is unknown; use one of: {', '.join(REPORT_VARIANTS)}"
            )

    @property
    def episode_variant(self) -> str:
        """Return the variant of an episode kind (the first one when unset)."""
        return self.variant or EPISODE_VARIANTS[self.kind][0]


@frozen
class FaultContext:
    """What the fault hook sees about one ``/run`` request.

    Attributes:
        server: the instance name of the server that received it.
        agent: the agent that server serves (an episode server may bind none).
        task_index: the rollout's task.
        rollout_index: the rollout.
        attempt_index: the attempt the request belongs to.
        row: the request body (a flat row, or an episode request).
        request_index: the request's index within its attempt (0: the first; retries of a
            429/503 within the attempt count up), per run id.
        run_id: the ``_ng_run_id`` a driver's batch stamped on the rollout, or None.
    """

    server: str
    agent: str | None
    task_index: int
    rollout_index: int
    attempt_index: int
    row: Mapping[str, Any]
    request_index: int = 0
    run_id: str | None = None


FaultFn = Callable[[FaultContext], "Fault | None"]


def unit_hash(*parts: object) -> float:
    """Return a deterministic number in [0, 1) from ``parts`` (stable across runs)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    (value,) = struct.unpack(">Q", digest)
    return float(value) / 2.0**64


@frozen(kw_only=True)
class FaultPlan:
    """A seeded, deterministic choice of faults per (task, rollout, attempt).

    Attributes:
        seed: the plan's seed.
        rate: the fraction of requests that get a fault, in [0, 1].
        mix: the faults to choose from with their weights.
        max_attempt: attempts above this index get no fault (None: any attempt may), so a
            run that retries is sure to finish.
    """

    seed: int = 0
    rate: float = 0.0
    mix: tuple[tuple[Fault, float], ...] = ()
    max_attempt: int | None = None

    def __attrs_post_init__(self) -> None:
        if not 0.0 <= self.rate <= 1.0:
            raise ConfigError(f"fault rate must be in [0, 1] (got {self.rate!r}); use e.g. 0.05")
        if self.rate > 0 and not self.mix:
            raise ConfigError("a fault plan with rate > 0 needs a mix; list at least one fault")
        if any(weight <= 0 for _, weight in self.mix):
            raise ConfigError("fault weights must be > 0; drop a fault instead of weighting it 0")

    def fault_for(self, task: int, rollout: int, attempt: int) -> Fault | None:
        """Return the fault this plan assigns to one request, or None."""
        if self.rate <= 0 or (self.max_attempt is not None and attempt > self.max_attempt):
            return None
        if unit_hash(self.seed, "rate", task, rollout, attempt) >= self.rate:
            return None
        point = unit_hash(self.seed, "mix", task, rollout, attempt) * self._total_weight()
        for fault, weight in self.mix:
            point -= weight
            if point < 0:
                return fault
        return self.mix[-1][0]

    def _total_weight(self) -> float:
        return sum(weight for _, weight in self.mix)


def fault_from_dict(data: Mapping[str, Any], *, where: str = "fault") -> Fault:
    """Build a `Fault` from a mapping such as ``{"kind": "status", "status": 503}``."""
    if not isinstance(data, Mapping) or "kind" not in data:
        raise ConfigError(
            f"{where} must be a mapping with a 'kind' (got {data!r}); "
            'write e.g. {"kind": "status", "status": 503}'
        )
    names = {a.name for a in attrs.fields(Fault)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{where} has unknown keys {unknown!r}; known keys are {sorted(names)!r}")
    return Fault(**dict(data))


def plan_from_dict(data: Mapping[str, Any] | None) -> FaultPlan:
    """Build a `FaultPlan` from ``{seed, rate, mix: [{kind, weight?, ...}], max_attempt}``."""
    if not data:
        return FaultPlan()
    mix: list[tuple[Fault, float]] = []
    for i, entry in enumerate(_as_sequence(data.get("mix", ()))):
        fields = dict(entry)
        weight = float(fields.pop("weight", 1.0))
        mix.append((fault_from_dict(fields, where=f"faults.mix[{i}]"), weight))
    return FaultPlan(
        seed=int(data.get("seed", 0)),
        rate=float(data.get("rate", 0.0)),
        mix=tuple(mix),
        max_attempt=data.get("max_attempt"),
    )


def _as_sequence(value: Any) -> Sequence[Mapping[str, Any]]:
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise ConfigError(f"faults.mix must be a list of fault mappings (got {value!r})")
    return value


def row_fault(row: Mapping[str, Any], attempt: int, request: int = 0) -> Fault | None:
    """Return the fault a row asks for in its ``fake_fault`` field, if it applies."""
    data = row.get(FAULT_FIELD)
    if data is None:
        return None
    fault = fault_from_dict(data, where=f"row field {FAULT_FIELD!r}")
    if fault.attempts is not None and attempt not in fault.attempts:
        return None
    if fault.requests is not None and request not in fault.requests:
        return None
    return fault
