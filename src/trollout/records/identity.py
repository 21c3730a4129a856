"""A rollout's identity: the stamps every row of the run folder repeats, read and written.

`Identity` is what keys a rollout (task, rollout) plus what describes it (agent, environment
server, result type, rollout id, task source, task id, provenance, policy model server, run
id); `Identity.from_row` reads it from any row a collector wrote or materialized, on the hot
path, and `Identity.stamp` writes it back in one fixed order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeGuard

import attrs
from attrs import frozen

from .keys import (
    AGENT_REF,
    ATTEMPT_INDEX,
    DATASET_DIGEST,
    DIGEST,
    ENVIRONMENT_SERVER,
    POLICY_MODEL_SERVER,
    PROVENANCE_KEYS,
    RESULT_TYPE,
    ROLLOUT_ID,
    ROLLOUT_INDEX,
    RUN_ID,
    TASK_DATA,
    TASK_ID,
    TASK_ID_FIELD,
    TASK_INDEX,
    TASK_INPUT,
    TASK_SOURCE,
    Row,
)

__all__ = ["Identity", "is_mapping", "is_task_row", "policy_model_server_of", "provenance_of"]


def is_task_row(row: Mapping[str, Any]) -> bool:
    """Return whether a row is a 0.7.0 materialized task (``task_id`` object + ``task_input``)."""
    return is_mapping(row.get(TASK_ID_FIELD)) and TASK_INPUT in row


@frozen
class Identity:
    """The identity and routing stamps of one rollout.

    Attributes:
        task_index: ``_ng_task_index``; identical input rows share one.
        rollout_index: ``_ng_rollout_index``, counted per task across repeats and agents.
        agent_name: ``agent_ref.name``, or None for rows routed by taskset.
        environment_server: ``_ng_environment_server``, the 0.7.0 server that fronts the agent.
        result_type: ``_ng_result_type``, that server's implementation name.
        rollout_id: ``_ng_rollout_id`` when the dataset row carried one explicitly.
        task_source: ``task_source`` when the row carried one.
        task_id: a task row's ``task_id`` (``{taskset, task_id}``), stamped as ``_ng_task_id``;
            None for a flat row. Its presence makes the rollout an episode.
        provenance: the `PROVENANCE_KEYS` of the row's ``task_data``, as (key, value) pairs.
        policy_model_server: ``ng_policy_model_server``, the model server of the agent that
            runs the rollout, when the deployment names one.
        run_id: ``_ng_run_id``, the run of a driver's batch or shard that dispatched the
            rollout (its rollout id carries the same prefix); None for a command-line run.

    The last four describe the rollout rather than key it: they take no part in equality.
    """

    task_index: int
    rollout_index: int
    agent_name: str | None = None
    environment_server: str | None = None
    result_type: str | None = None
    rollout_id: str | None = None
    task_source: str | None = None
    task_id: Mapping[str, Any] | None = attrs.field(default=None, eq=False)
    provenance: tuple[tuple[str, Any], ...] = attrs.field(default=(), eq=False)
    policy_model_server: str | None = attrs.field(default=None, eq=False)
    run_id: str | None = attrs.field(default=None, eq=False)

    @property
    def key(self) -> tuple[int, int]:
        """The resume key ``(task, rollout)``."""
        return (self.task_index, self.rollout_index)

    def rollout_id_for(self, attempt_index: int = 0) -> str:
        """Return the capture id: explicit or ``task-rollout``, plus ``-aN`` for attempt N > 0."""
        base = self.rollout_id or f"{self.task_index}-{self.rollout_index}"
        return f"{base}-a{attempt_index}" if attempt_index else base

    def stamps(self, attempt_index: int = 0) -> Row:
        """Return the stamps this identity puts on a row (absent values left out)."""
        row: Row = {}
        self.stamp(row, attempt_index)
        return row

    def stamp(self, row: Row, attempt_index: int = 0) -> None:
        """Put this identity's stamps on ``row``, in `stamps` order, over any it holds."""
        row[TASK_INDEX] = self.task_index
        row[ROLLOUT_INDEX] = self.rollout_index
        if self.agent_name is not None:
            row[AGENT_REF] = {"name": self.agent_name}
        if attempt_index:
            row[ATTEMPT_INDEX] = attempt_index
        if self.rollout_id is not None:
            row[ROLLOUT_ID] = self.rollout_id
        if self.environment_server is not None:
            row[ENVIRONMENT_SERVER] = self.environment_server
        if self.result_type is not None:
            row[RESULT_TYPE] = self.result_type
        if self.task_source is not None:
            row[TASK_SOURCE] = self.task_source
        if self.task_id is not None:
            row[TASK_ID] = self.task_id
        row.update(self.provenance)
        if self.policy_model_server is not None:
            row[POLICY_MODEL_SERVER] = self.policy_model_server
        if self.run_id is not None:
            row[RUN_ID] = self.run_id

    @classmethod
    def from_row(
        cls, row: Mapping[str, Any], policy_model_servers: Mapping[str, str] | None = None
    ) -> Identity:
        """Read the stamps of a row written by a collector, or of a materialized row.

        Args:
            row: the row.
            policy_model_servers: the deployment's model server per agent or environment
                server (`policy_model_server_of`); the row's executor's entry, when there is
                one, is its ``policy_model_server`` (over any the row carries). A collector
                reading the rows it dispatches passes it, so the identity is built once.
        """
        agent_ref = row.get(AGENT_REF)
        task_id = row.get(TASK_ID)
        if task_id is None and is_task_row(row):
            task_id = row[TASK_ID_FIELD]
        agent_name = agent_ref.get("name") if is_mapping(agent_ref) else None
        environment_server = row.get(ENVIRONMENT_SERVER)
        policy = None
        if policy_model_servers:
            policy = policy_model_server_of(policy_model_servers, agent_name, environment_server)
        if policy is None:
            policy = row.get(POLICY_MODEL_SERVER)
        run_id = row.get(RUN_ID)
        # Positional, in field order: every row read back pays this, and eleven keywords cost a
        # third more than the construction itself.
        return cls(
            row[TASK_INDEX],
            row[ROLLOUT_INDEX],
            agent_name,
            environment_server,
            row.get(RESULT_TYPE),
            row.get(ROLLOUT_ID),
            row.get(TASK_SOURCE),
            task_id if is_mapping(task_id) else None,
            provenance_of(row),
            policy if isinstance(policy, str) else None,
            run_id if isinstance(run_id, str) else None,
        )


def policy_model_server_of(
    servers: Mapping[str, str], agent_name: str | None, environment_server: str | None
) -> str | None:
    """Return the model server of the agent that runs a rollout (None: the deployment names none).

    ``servers`` maps agent and environment server names to model servers
    (`collector.deployment.Deployment.policy_model_servers`); a rollout is looked up by its
    agent, else by the environment server that fronts it.
    """
    return servers.get(agent_name or environment_server or "")


def is_mapping(value: object) -> TypeGuard[Mapping[str, Any]]:
    """Return ``isinstance(value, Mapping)``, skipping the ABC check for a dict or None.

    Rows are parsed JSON: their objects are dicts and absent keys None, and an ABC check costs
    a few hundred ns on every row the collector reads.
    """
    return type(value) is dict or (value is not None and isinstance(value, Mapping))


def provenance_of(row: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Return a row's provenance stamps: its own (a record), else its ``task_data``'s."""
    if DIGEST not in row and DATASET_DIGEST not in row:
        data = row.get(TASK_DATA)
        if not is_mapping(data):
            return ()  # the common case, every flat row: two lookups and out
        row = data
    return tuple((key, row[key]) for key in PROVENANCE_KEYS if key in row)
