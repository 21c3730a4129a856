"""The records of a run: the materialized row, the three outcomes, the status and manifest.

`MaterializedRow` is exactly what `/run` receives; `Landed`, `Failed` and `Omitted` are what an
attempt came to (`Outcome`); `RolloutStatus` and `BatchStatus` are ``<stem>_batch_status.json``;
`RunManifest` is the run's manifest. Their rows are made and read by `rows.converter`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeAlias

import attrs
from attrs import frozen

from .identity import Identity
from .keys import ATTEMPT_INDEX, TASK_INPUT, Delivery, OmitReason, RolloutState, Row

__all__ = [
    "BatchStatus",
    "Failed",
    "Landed",
    "MaterializedRow",
    "Omitted",
    "Outcome",
    "RolloutStatus",
    "RunManifest",
]


@frozen
class MaterializedRow:
    """A task row after routing, repeats and seeding: exactly what `/run` receives.

    Attributes:
        identity: the rollout's stamps, read from `body`.
        body: the whole materialized row as written to the materialized-inputs file; the identity
            keys are already stamped on it. Treat as immutable.
        raw: `body` as JSON text, exactly as read from the materialized-inputs file, or None. A
            flat row's first attempt sends it as it is (`request_bytes`): the row was parsed
            once to read its identity and is not serialized again.
    """

    identity: Identity
    body: Mapping[str, Any] = attrs.field(eq=False, repr=False)
    raw: bytes | None = attrs.field(default=None, eq=False, repr=False)

    @classmethod
    def from_body(
        cls,
        body: Mapping[str, Any],
        raw: bytes | None = None,
        policy_model_servers: Mapping[str, str] | None = None,
    ) -> MaterializedRow:
        """Wrap a stamped body (and its JSON text `raw`), reading its identity from the stamps.

        ``policy_model_servers`` stamps the identity's model server (`Identity.from_row`).
        """
        return cls(Identity.from_row(body, policy_model_servers), body, raw)

    @property
    def is_episode(self) -> bool:
        """Whether the row is a task row, sent as an episode request (docs/protocol.md 3)."""
        return self.identity.task_id is not None

    def request_body(self, attempt_index: int = 0) -> Row:
        """Return the `/run` body for one attempt.

        A flat row goes out whole (``_ng_attempt_index`` added when > 0). A task row goes out as
        an episode request holding only ``episode_id`` (the rollout id without its ``-aN``
        suffix, and the attempt) and ``task`` (its ``task_id`` and ``task_input``, unmodified):
        episode servers refuse any other key.
        """
        if self.identity.task_id is not None:
            episode_id = {"rollout_id": self.identity.rollout_id_for(0), "attempt": attempt_index}
            task = {"task_id": self.identity.task_id, "task_input": self.body[TASK_INPUT]}
            return {"episode_id": episode_id, "task": task}
        body = dict(self.body)
        if attempt_index:
            body[ATTEMPT_INDEX] = attempt_index
        return body


@frozen
class Landed:
    """An attempt that returned a result.

    Attributes:
        identity: the rollout.
        attempt_index: the attempt that landed.
        result: the server's reply without the collector's stamps; for an episode, the reply's
            inner ``result`` (its ``_ng_task_id`` is an identity stamp).
        elapsed_seconds: wall time of the attempt, or None when not measured.
    """

    identity: Identity
    attempt_index: int
    result: Mapping[str, Any] = attrs.field(eq=False, repr=False)
    elapsed_seconds: float | None = None

    @property
    def reward(self) -> float | None:
        """The top-level ``reward``, or None when the reply is unscored."""
        reward = self.result.get("reward")
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            return None
        return float(reward)


@frozen
class Failed:
    """An attempt that ended in a typed failure (a failure is data, not an exception).

    Attributes:
        identity: the rollout.
        attempt_index: the attempt that failed.
        failure_class: ``_ng_failure_class``: a `FailureClass` value or a producer's label.
        kind: ``failure_kind``, a finer reason (``connect``, ``read_timeout``, ``http_500``...).
        terminal: ``_ng_failure_terminal``: never retry this rollout.
        exception_type: ``_ng_failure_type``, the exception class or reply shape.
        message: ``_ng_failure_message``, at most 2000 characters.
        http_status: ``_ng_failure_http_status``, or None when no response began.
        response_body: ``_ng_failure_response_body``, cut to 2000 characters with ``…``.
        max_attempts: ``_ng_failure_max_attempts``, the attempt cap in force.
        delivery: how far the request got (``_ng_failure_delivery``).
        no_persist: the reply carried ``_ng_no_persist``: the row is written nowhere.
        elapsed_seconds: wall time of the attempt, or None.
        extra: the producer's own reply fields when the failure came inside a 200 (kept as sent);
            for an episode ``failure``, its ``_ng_failure_stage``, ``_ng_failure_partial_response``
            and FailureReport keys.
        retry_after_s: the reply's ``Retry-After`` in seconds, for the retry policy (not
            written to the run folder), or None.
    """

    identity: Identity
    attempt_index: int
    failure_class: str
    kind: str | None = None
    terminal: bool = False
    exception_type: str | None = None
    message: str | None = None
    http_status: int | None = None
    response_body: str | None = None
    max_attempts: int | None = None
    delivery: Delivery = Delivery.DELIVERED
    no_persist: bool = False
    elapsed_seconds: float | None = None
    extra: Mapping[str, Any] = attrs.field(factory=dict, eq=False, repr=False)
    retry_after_s: float | None = attrs.field(default=None, eq=False)

    @property
    def spends_attempt(self) -> bool:
        """Whether this failure uses up one of the rollout's attempts."""
        return self.delivery is not Delivery.NOT_SENT


@frozen
class Omitted:
    """An attempt with no execution: interrupted in flight, or never started.

    Attributes:
        identity: the rollout.
        attempt_index: the attempt that was omitted.
        reason: interrupted or drained.
        elapsed_seconds: how long it was in flight before the interruption, or None.
    """

    identity: Identity
    attempt_index: int
    reason: OmitReason
    elapsed_seconds: float | None = None


Outcome: TypeAlias = Landed | Failed | Omitted


@frozen
class RolloutStatus:
    """One rollout's latest state in the batch status file (identity, class, kind: no payloads)."""

    task_index: int
    rollout_index: int
    attempt_index: int
    state: RolloutState
    agent_name: str | None = None
    failure_class: str | None = None
    kind: str | None = None
    terminal: bool = False


@frozen
class BatchStatus:
    """Saved progress of a run (``<stem>_batch_status.json``).

    Attributes:
        expected: rollouts the run was asked for.
        completed: rollouts whose outcome is landed.
        failed: rollouts whose latest outcome is a written failure.
        no_persist: rollouts whose latest outcome was a kill-shaped reply.
        omitted: rollouts whose latest attempt was interrupted in flight.
        not_started: rollouts of ``expected`` no attempt of which ever started: never sent (a
            batch cut early, a run stopped before it reached them) or drained (the budget, the
            deadline, admission closed). With the four counts above they sum to ``expected``.
        failures_by_class: failed rollouts counted by class.
        finished: the writer closed and every expected rollout has an outcome (``not_started``
            is 0); a run stopped or cut early is closed but not finished.
        closed: the writer closed (normally or stopped): no collector updates this file.
        updated_at: Unix time of this snapshot.
        rollouts: the latest state of every rollout that has not landed (a drained one has
            kind ``drained``).
    """

    expected: int
    completed: int = 0
    failed: int = 0
    no_persist: int = 0
    omitted: int = 0
    not_started: int = 0
    failures_by_class: dict[str, int] = attrs.field(factory=dict)
    finished: bool = False
    closed: bool = False
    updated_at: float = 0.0
    rollouts: tuple[RolloutStatus, ...] = ()


@frozen
class RunManifest:
    """The identity of a run, written before the first dispatch.

    Attributes:
        run_id: a unique id for the run folder.
        trollout_version: the version that created it.
        created_at: Unix time of creation.
        input_sha256: sha256 of the input file's bytes.
        settings_sha256: sha256 of the resolved settings that change what is dispatched.
        deployment_sha256: sha256 of the deployment's agent set and routes.
        expected_rollouts: materialized rollouts.
        tasks: distinct tasks.
        settings: the resolved settings, for ``trollout resume``.
        deployment: the agent set the run began with (``agents``, ``environment_servers``:
            sorted names), to say what changed when the deployment fingerprint differs.
    """

    run_id: str
    trollout_version: str
    created_at: float
    input_sha256: str
    settings_sha256: str
    deployment_sha256: str
    expected_rollouts: int
    tasks: int
    settings: dict[str, Any] = attrs.field(factory=dict)
    deployment: dict[str, Any] = attrs.field(factory=dict)
