"""The records trollout passes around, and the one converter to NeMo Gym rows.

A leaf package (it imports nothing of trollout's but `errors`), in four modules: `keys` (the
key names of a row and the enumerations their values take), `identity` (a rollout's stamps),
`outcomes` (the records) and `rows` (the converter). Every name is imported from here.

Inside trollout, code passes these frozen attrs records; dict rows exist only at the edges. The
module-level `converter` is the one place that maps records to and from the rows NeMo Gym writes
and reads (docs/protocol.md sections 2 and 7), with the exact key names:

- `MaterializedRow` <-> a line of ``<stem>_materialized_inputs.jsonl``: a flat row is the `/run`
  request body; a 0.7.0 task row (``task_id`` + ``task_input``) goes out as an episode request
  (docs/protocol.md section 3, `MaterializedRow.request_body`).
- `Landed` <-> a line of the rollouts file: the server's reply plus the collector's stamps.
- `Failed` <-> a line of ``<stem>_failures.jsonl``.
- `Omitted` <-> an ``_ng_omitted_rollout`` line (only with ``record_omitted_rollouts``).
- `BatchStatus` <-> ``<stem>_batch_status.json``; `RunManifest` <-> the manifest.

Every outcome carries an `Identity`: the identity and routing stamps every row of the run folder
repeats (task, rollout, agent, environment server, result type, explicit rollout id, task source;
for a task row its ``_ng_task_id``; the dataset's provenance keys; the policy model server). The
attempt number sits beside it on the outcome, because one rollout has several attempts.

Design note: one module, 690 lines, held the key names, the records and the converter; split,
each is read alone, and the converter's design note lives in `rows`.
"""

from __future__ import annotations

# Every public name of the four modules is re-exported, and `__all__` spells the list again:
# repeated on purpose (duplicates flags it), since a computed `__all__` is opaque to mypy and
# ruff, which would then see no export at all.
from .identity import Identity, is_mapping, is_task_row, policy_model_server_of, provenance_of
from .keys import (
    AGENT_REF,
    ATTEMPT_INDEX,
    COLLECTOR_KEY_PREFIX,
    DATASET_DIGEST,
    DIGEST,
    DISPATCH_DRAINED,
    ELAPSED,
    ENVIRONMENT_SERVER,
    FAILURE_BODY,
    FAILURE_CLASS,
    FAILURE_DELIVERY,
    FAILURE_EVENTS,
    FAILURE_EVENTS_OMITTED,
    FAILURE_HTTP_STATUS,
    FAILURE_ID,
    FAILURE_KEYS,
    FAILURE_KIND,
    FAILURE_MAX_ATTEMPTS,
    FAILURE_MESSAGE,
    FAILURE_PARTIAL_RESPONSE,
    FAILURE_STAGE,
    FAILURE_TERMINAL,
    FAILURE_TYPE,
    IDENTITY_KEYS,
    NO_PERSIST,
    OMITTED,
    POLICY_MODEL_SERVER,
    PROVENANCE_KEYS,
    RESULT_TYPE,
    ROLLOUT_ID,
    ROLLOUT_ID_PATTERN,
    ROLLOUT_INDEX,
    RUN_ID,
    STAMP_KEYS,
    TASK_DATA,
    TASK_ID,
    TASK_ID_FIELD,
    TASK_INDEX,
    TASK_INPUT,
    TASK_SOURCE,
    Delivery,
    FailureClass,
    OmitReason,
    RolloutState,
    Row,
)
from .outcomes import (
    BatchStatus,
    Failed,
    Landed,
    MaterializedRow,
    Omitted,
    Outcome,
    RolloutStatus,
    RunManifest,
)
from .rows import converter, outcome_from_row, outcome_to_row

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
    "BatchStatus",
    "Delivery",
    "Failed",
    "FailureClass",
    "Identity",
    "Landed",
    "MaterializedRow",
    "OmitReason",
    "Omitted",
    "Outcome",
    "RolloutState",
    "RolloutStatus",
    "Row",
    "RunManifest",
    "converter",
    "is_mapping",
    "is_task_row",
    "outcome_from_row",
    "outcome_to_row",
    "policy_model_server_of",
    "provenance_of",
]
