"""NeMo Gym's batch manifest (``batch_manifest_fpath``): members checked, then their status.

Several benchmarks may share one deployment and one run; a batch manifest declares them::

    {"schema_version": "1",
     "members": {"<member>": {"agent_name": "...", "expected_task_count": 30,
                              "expected_rollout_count": 90, ...}}}

- Before dispatch (`check_members`): every member names an agent (a string); the plan's
  agents are exactly the members' agents; a member's declared task and rollout counts, when
  given, equal the plan's for its agent. Anything else is refused before a file is written.
  NeMo Gym also checks fingerprints (``dataset_sha256``, ``resolved_recipe_sha256``) whose
  recipe its API reference does not give; trollout does not check them (its own run manifest
  fingerprints the input file and the settings).
- After collection and after ``trollout aggregate`` (`write_batch_status`):
  ``batch_status.json`` beside the manifest (`status_path`; a manifest that is that file, by
  name or through a link, is refused when read, before anything is written) holds, per
  member's agent,
  ``expected_rollout_count``, ``completed_rollout_count`` (landed),
  ``remaining_rollout_count`` (what a resume would still run: neither landed nor settled as
  resume settles a rollout), ``failures_by_class`` (rollouts that did not land, by their latest
  class) and ``aggregation_status`` (``ok``, ``error``, or ``not_run``).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import orjson
from attrs import frozen

from ..errors import ConfigError
from ..recovery.files import replace_atomically
from .coverage import OMITTED
from .reader import Collection
from .shards import refuse_overlaps

__all__ = ["Member", "check_members", "read_batch_manifest", "status_path", "write_batch_status"]

_SCHEMA: Final = "1"
STATUS_NAME: Final = "batch_status.json"


@frozen
class Member:
    """One benchmark of a batch: its name, agent and declared counts."""

    name: str
    agent: str
    expected_tasks: int | None = None
    expected_rollouts: int | None = None


def read_batch_manifest(path: str | Path) -> list[Member]:
    """Read a batch manifest's members.

    Raises:
        ConfigError: the file cannot be read or is not a schema 1 batch manifest, or it is the
            batch status file written beside it.
    """
    shown = repr(str(path))
    refuse_overlaps([("the batch status", status_path(path))], [("the batch manifest", Path(path))])
    try:
        data = orjson.loads(Path(path).read_bytes())
    except OSError as exc:
        raise ConfigError(f"cannot read batch_manifest_fpath {shown}: {exc.strerror}") from exc
    except orjson.JSONDecodeError:
        raise ConfigError(f"batch_manifest_fpath {shown} is not JSON; fix the file") from None
    members = data.get("members") if isinstance(data, dict) else None
    if not isinstance(data, dict) or data.get("schema_version") != _SCHEMA:
        raise ConfigError(
            f"batch_manifest_fpath {shown} must be a batch manifest with schema_version "
            f"{_SCHEMA!r}; fix the file"
        )
    if not isinstance(members, dict) or not members:
        raise ConfigError(f"batch_manifest_fpath {shown} declares no members; list them")
    return [_member(shown, name, entry) for name, entry in members.items()]


def _member(shown: str, name: str, entry: Any) -> Member:
    agent = entry.get("agent_name") if isinstance(entry, dict) else None
    if not isinstance(agent, str) or not agent:
        raise ConfigError(
            f"batch_manifest_fpath {shown}: member {name!r} must name its agent (agent_name, "
            "a string); fix the file"
        )
    counts = [entry.get("expected_task_count"), entry.get("expected_rollout_count")]
    for key, count in zip(("expected_task_count", "expected_rollout_count"), counts, strict=True):
        if count is not None and (type(count) is not int or count < 0):
            raise ConfigError(
                f"batch_manifest_fpath {shown}: member {name!r} {key} must be an integer >= 0 "
                f"(got {count!r}); fix the file"
            )
    return Member(name, agent, *counts)


def status_path(manifest: str | Path) -> Path:
    """Return the batch status file of a manifest: ``batch_status.json`` beside it."""
    return Path(manifest).with_name(STATUS_NAME)


def check_members(members: Iterable[Member], planned: Mapping[str, tuple[int, int]]) -> None:
    """Check the members against the plan's ``agent -> (tasks, rollouts)``.

    Raises:
        ConfigError: every mismatch, in one message.
    """
    problems = []
    declared = {m.agent for m in members}
    for agent in sorted(planned.keys() - declared):
        problems.append(f"the plan routes rows to agent {agent!r}, which no member declares")
    for member in members:
        tasks, rollouts = planned.get(member.agent, (0, 0))
        if not rollouts:
            problems.append(f"member {member.name!r}: the plan has no rows for {member.agent!r}")
        for what, declared_count, count in (
            ("tasks", member.expected_tasks, tasks),
            ("rollouts", member.expected_rollouts, rollouts),
        ):
            if declared_count is not None and declared_count != count:
                problems.append(
                    f"member {member.name!r} declares {declared_count} {what}, the plan has {count}"
                )
    if problems:
        raise ConfigError(
            "the batch manifest does not match the plan: "
            + "; ".join(problems)
            + "; fix the manifest or the input"
        )


def write_batch_status(
    manifest: str | Path,
    members: Iterable[Member],
    collection: Collection,
    *,
    aggregation: str,
    cap: int,
    retry_timeouts: bool = False,
) -> Path:
    """Write ``batch_status.json`` beside the manifest from a resolved collection; return it."""
    path = status_path(manifest)
    status = {
        "schema_version": _SCHEMA,
        "updated_at": time.time(),
        "members": {
            m.agent: {"member": m.name, **_counts(collection, m.agent, cap, retry_timeouts)}
            | {"aggregation_status": aggregation}
            for m in members
        },
    }
    replace_atomically(path, [orjson.dumps(status, option=orjson.OPT_INDENT_2), b"\n"])
    return path


def _counts(collection: Collection, agent: str, cap: int, retry_timeouts: bool) -> dict[str, Any]:
    key = (agent, None)
    group = collection.groups.get(key)
    if group is None:
        return {
            "expected_rollout_count": 0,
            "completed_rollout_count": 0,
            "remaining_rollout_count": 0,
            "failures_by_class": {},
        }
    expected = sum(s.known.bit_count() for s in group.tasks.values())
    landed = sum(s.landed.bit_count() for s in group.tasks.values())
    settled = 0
    failures: Counter[str] = Counter()
    ledger = collection.ledger
    for rollout_key, mark in ledger.marks.items():
        if rollout_key[0] != key or group.task(rollout_key[1]).landed >> rollout_key[2] & 1:
            continue
        if mark.failure_class != OMITTED:
            failures[mark.failure_class] += 1
        settled += ledger.settled(mark, rollout_key, cap, retry_timeouts=retry_timeouts)
    return {
        "expected_rollout_count": expected,
        "completed_rollout_count": landed,
        "remaining_rollout_count": expected - landed - settled,
        "failures_by_class": dict(sorted(failures.items())),
    }
