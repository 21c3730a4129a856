"""The words of a row: every key name trollout stamps or reads, and the values they take.

The key names are NeMo Gym's (docs/protocol.md sections 2 and 7), spelled once here; the
enumerations are the classes, deliveries, omit reasons and states a row's keys hold.
"""

from __future__ import annotations

import enum
import re
from typing import Any, Final, TypeAlias

__all__ = [
    "AGENT_REF",
    "ATTEMPT_INDEX",
    "COLLECTOR_KEY_PREFIX",
    "DATASET_DIGEST",
    "DIGEST",
    "DISPATCH_DRAINED",
    "ELAPSED",
    "ENVIRONMENT_SERVER",
    "FAILURE_BODY",
    "FAILURE_CLASS",
    "FAILURE_DELIVERY",
    "FAILURE_EVENTS",
    "FAILURE_EVENTS_OMITTED",
    "FAILURE_HTTP_STATUS",
    "FAILURE_ID",
    "FAILURE_KEYS",
    "FAILURE_KIND",
    "FAILURE_MAX_ATTEMPTS",
    "FAILURE_MESSAGE",
    "FAILURE_PARTIAL_RESPONSE",
    "FAILURE_STAGE",
    "FAILURE_TERMINAL",
    "FAILURE_TYPE",
    "IDENTITY_KEYS",
    "NO_PERSIST",
    "OMITTED",
    "POLICY_MODEL_SERVER",
    "PROVENANCE_KEYS",
    "RESULT_TYPE",
    "ROLLOUT_ID",
    "ROLLOUT_ID_PATTERN",
    "ROLLOUT_INDEX",
    "RUN_ID",
    "STAMP_KEYS",
    "TASK_DATA",
    "TASK_ID",
    "TASK_ID_FIELD",
    "TASK_INDEX",
    "TASK_INPUT",
    "TASK_SOURCE",
    "Delivery",
    "FailureClass",
    "OmitReason",
    "RolloutState",
    "Row",
]

COLLECTOR_KEY_PREFIX: Final = "_ng_"
ROLLOUT_ID_PATTERN: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

# Keys the collector stamps on every row it writes (docs/protocol.md section 7).
TASK_INDEX: Final = "_ng_task_index"
ROLLOUT_INDEX: Final = "_ng_rollout_index"
ATTEMPT_INDEX: Final = "_ng_attempt_index"
ROLLOUT_ID: Final = "_ng_rollout_id"
ENVIRONMENT_SERVER: Final = "_ng_environment_server"
RESULT_TYPE: Final = "_ng_result_type"
AGENT_REF: Final = "agent_ref"
TASK_SOURCE: Final = "task_source"
ELAPSED: Final = "elapsed_seconds"
TASK_ID: Final = "_ng_task_id"  # a task row's {taskset, task_id}, on each of its records
POLICY_MODEL_SERVER: Final = "ng_policy_model_server"  # the executing agent's model server
RUN_ID: Final = "_ng_run_id"  # the run (a driver's batch or shard) that dispatched the rollout
DIGEST: Final = "_ng_digest"
DATASET_DIGEST: Final = "_ng_dataset_digest"
PROVENANCE_KEYS: Final = (DIGEST, DATASET_DIGEST)
"""The keys of a row's ``task_data`` copied onto its records (and no others: the dataset
cannot set the collector's other ``_ng_*`` keys through them)."""
IDENTITY_KEYS: Final = frozenset(
    {TASK_INDEX, ROLLOUT_INDEX, ATTEMPT_INDEX, ROLLOUT_ID, ENVIRONMENT_SERVER, RESULT_TYPE}
)
STAMP_KEYS: Final = IDENTITY_KEYS | {
    AGENT_REF,
    TASK_SOURCE,
    ELAPSED,
    TASK_ID,
    POLICY_MODEL_SERVER,
    RUN_ID,
    *PROVENANCE_KEYS,
}
"""Every key the collector stamps on a record (a reply's own values for them are dropped)."""

# Materialized task rows (docs/protocol.md section 3).
TASK_ID_FIELD: Final = "task_id"
TASK_INPUT: Final = "task_input"
TASK_DATA: Final = "task_data"

# Failure-row keys (docs/protocol.md sections 2 and 7).
FAILURE_CLASS: Final = "_ng_failure_class"
FAILURE_TERMINAL: Final = "_ng_failure_terminal"
FAILURE_TYPE: Final = "_ng_failure_type"
FAILURE_MESSAGE: Final = "_ng_failure_message"
FAILURE_HTTP_STATUS: Final = "_ng_failure_http_status"
FAILURE_BODY: Final = "_ng_failure_response_body"
FAILURE_MAX_ATTEMPTS: Final = "_ng_failure_max_attempts"
FAILURE_DELIVERY: Final = "_ng_failure_delivery"
FAILURE_KIND: Final = "failure_kind"
FAILURE_STAGE: Final = "_ng_failure_stage"
FAILURE_PARTIAL_RESPONSE: Final = "_ng_failure_partial_response"
FAILURE_EVENTS: Final = "_ng_failure_events"
FAILURE_ID: Final = "_ng_failure_id"
FAILURE_EVENTS_OMITTED: Final = "_ng_failure_events_omitted"
NO_PERSIST: Final = "_ng_no_persist"
OMITTED: Final = "_ng_omitted_rollout"
DISPATCH_DRAINED: Final = "_ng_dispatch_drained"
FAILURE_KEYS: Final = frozenset(
    {
        FAILURE_CLASS,
        FAILURE_TERMINAL,
        FAILURE_TYPE,
        FAILURE_MESSAGE,
        FAILURE_HTTP_STATUS,
        FAILURE_BODY,
        FAILURE_MAX_ATTEMPTS,
        FAILURE_DELIVERY,
        FAILURE_KIND,
        NO_PERSIST,
    }
)
"""The typed fields of a `Failed` row; what else the row holds is its ``extra``."""

Row: TypeAlias = dict[str, Any]


class FailureClass(enum.StrEnum):
    """Failure classes trollout assigns or knows (docs/protocol.md section 2).

    A producer may send any label in ``_ng_failure_class``; `Failed.failure_class` is therefore a
    plain string, and these members compare equal to their values.
    """

    # The collector's own classes.
    # no reply, or a gateway status: nothing proves it ran
    AGENT_REQUEST_FAILED = "agent_request_failed"
    AGENT_RUN_ERROR = "agent_run_error"  # the server answered with an error: it ran and broke
    ENVIRONMENT_SERVER_FAILED = "environment_server_failed"  # an episode reply held a `failure`
    ENVIRONMENT_PROTOCOL_VIOLATION = "environment_protocol_violation"  # a reply of the wrong shape
    CANCELLED = "cancelled"  # interrupted, or never started (drained)
    # Labels producers send inside a 200 (routing is by the sentinel keys, not by these).
    KILL_SHAPED = "kill_shaped"  # worker or sandbox killed; usually with _ng_no_persist
    TIMEOUT_EXCEEDED = "timeout_exceeded"  # the producer's own time limit (terminal)
    SKIPPED = "skipped"  # the producer declined the task (terminal)
    TRANSIENT = "transient"  # retryable infrastructure trouble
    LEGITIMATE = "legitimate"  # the producer judged the failure a real model failure
    INCOMPLETE = "incomplete"  # the episode did not finish
    JUDGE_FAILED = "judge_failed"  # the judge could not score (carries reward 0.0)
    REMOTE_AGENT_ERROR = "remote_agent_error"  # an agent behind the server failed


class Delivery(enum.Enum):
    """How far a failed request got; only delivered attempts may spend an attempt."""

    NOT_SENT = "not_sent"  # never reached the server (connect refused, DNS, pool timeout)
    POSSIBLY_DELIVERED = "possibly_delivered"  # bytes went out, no response began
    DELIVERED = "delivered"  # the server answered


class OmitReason(enum.Enum):
    """Why an attempt produced no execution."""

    INTERRUPTED = "interrupted"  # cancelled while in flight (signal, deadline, early exit)
    DRAINED = "drained"  # never started: the dispatch budget or the run deadline passed


class RolloutState(enum.Enum):
    """Where a rollout's latest outcome went."""

    LANDED = "landed"  # in the rollouts file
    FAILED = "failed"  # in the failures sidecar
    NO_PERSIST = "no_persist"  # a kill-shaped reply: written nowhere, resume re-runs it
    OMITTED = "omitted"  # interrupted or drained: written nowhere unless record_omitted_rollouts
