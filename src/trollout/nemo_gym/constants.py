"""NeMo Gym's public constants of ``nemo_gym.rollouts.rollout_collection`` (0.7.0), by name.

These are NeMo Gym's names for keys of its wire and file formats, with NeMo Gym's values, so a
script that imports them from here reads the same keys. trollout's own names for the same keys
live in `trollout.records`; ``tests/nemo_gym/test_constants.py`` holds the two equal, so the
format keeps one definition. (The constants are spelled out rather than imported from
`records` because this package is built on trollout's public API alone.)
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "AGENT_REQUEST_FAILED_FAILURE_CLASS",
    "AGENT_RUN_ERROR_FAILURE_CLASS",
    "ENVIRONMENT_SERVER_FAILURE_CLASS",
    "NG_DATASET_DIGEST_KEY",
    "NG_DIGEST_KEY",
    "NG_ELAPSED_KEY",
    "NG_ENVIRONMENT_SERVER_KEY",
    "NG_FAILURE_COUNTS_AS_ZERO_KEY",
    "NG_FAILURE_JUDGE_ERROR_KEY",
    "NG_FAILURE_LEGACY_CLASS_KEY",
    "NG_FAILURE_MAX_ATTEMPTS_KEY",
    "NG_FAILURE_REPORT_KEYS",
    "NG_OMITTED_ROLLOUT_KEY",
    "NG_POLICY_MODEL_SERVER_KEY",
    "NG_RESULT_TYPE_KEY",
    "NG_TASK_ID_KEY",
    "NG_TERMINAL_KEY",
    "NG_UNROUTED_RUN_ERROR_KEY",
    "PROVENANCE_KEYS",
    "ROLLOUT_REPEAT_ATTRIBUTE",
    "STATUS_FAILURE_KIND_KEY",
    "STATUS_MODEL_FINAL_KEY",
    "TASK_ID_ATTRIBUTE",
]

AGENT_REQUEST_FAILED_FAILURE_CLASS: Final = "agent_request_failed"
AGENT_RUN_ERROR_FAILURE_CLASS: Final = "agent_run_error"
ENVIRONMENT_SERVER_FAILURE_CLASS: Final = "environment_server_failed"
NG_DATASET_DIGEST_KEY: Final = "_ng_dataset_digest"
NG_DIGEST_KEY: Final = "_ng_digest"
NG_ELAPSED_KEY: Final = "elapsed_seconds"
NG_ENVIRONMENT_SERVER_KEY: Final = "_ng_environment_server"
NG_FAILURE_COUNTS_AS_ZERO_KEY: Final = "_ng_failure_counts_as_zero"
NG_FAILURE_JUDGE_ERROR_KEY: Final = "_ng_failure_judge_error"
NG_FAILURE_LEGACY_CLASS_KEY: Final = "_ng_failure_legacy_class"
NG_FAILURE_MAX_ATTEMPTS_KEY: Final = "_ng_failure_max_attempts"
NG_FAILURE_REPORT_KEYS: Final = (
    "_ng_failure_events",
    "_ng_failure_id",
    "_ng_failure_events_omitted",
)
NG_OMITTED_ROLLOUT_KEY: Final = "_ng_omitted_rollout"
NG_POLICY_MODEL_SERVER_KEY: Final = "ng_policy_model_server"
NG_RESULT_TYPE_KEY: Final = "_ng_result_type"
NG_TASK_ID_KEY: Final = "_ng_task_id"
NG_TERMINAL_KEY: Final = "_ng_failure_terminal"
NG_UNROUTED_RUN_ERROR_KEY: Final = "_ng_unrouted_run_error"
PROVENANCE_KEYS: Final = (NG_DIGEST_KEY, NG_DATASET_DIGEST_KEY)
ROLLOUT_REPEAT_ATTRIBUTE: Final = "nemo.gym.rollout.repeat"
STATUS_FAILURE_KIND_KEY: Final = "failure_kind"
STATUS_MODEL_FINAL_KEY: Final = "_ng_model_final"
TASK_ID_ATTRIBUTE: Final = "nemo.gym.task.id"

# The row keys this package reads (NeMo Gym's wire names; trollout.records has the same).
TASK_INDEX_KEY: Final = "_ng_task_index"
ROLLOUT_INDEX_KEY: Final = "_ng_rollout_index"
RUN_ID_KEY: Final = "_ng_run_id"
AGENT_REF_KEY: Final = "agent_ref"
