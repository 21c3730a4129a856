"""Build run folders by hand for resume tests: materialized inputs, outcome rows, ledger."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from builders import AGENT, append_jsonl, row_body, write_jsonl
from trollout.recovery.layout import RunLayout
from trollout.recovery.ledger import encode_release, encode_reservation


def stamps(task: int, rollout: int, attempt: int) -> dict[str, Any]:
    """Return the identity stamps of one attempt."""
    row: dict[str, Any] = {
        "_ng_task_index": task,
        "_ng_rollout_index": rollout,
        "agent_ref": {"name": AGENT},
    }
    if attempt:
        row["_ng_attempt_index"] = attempt
    return row


def landed(task: int, rollout: int, attempt: int = 0, **extra: Any) -> dict[str, Any]:
    """Return a success row."""
    return {"response": {"output": []}, "reward": 1.0, **stamps(task, rollout, attempt), **extra}


def failure(
    task: int,
    rollout: int,
    attempt: int = 0,
    *,
    cls: str = "agent_run_error",
    terminal: bool = False,
    delivery: str = "delivered",
    **extra: Any,
) -> dict[str, Any]:
    """Return a failure-sidecar row."""
    return {
        "_ng_failure_class": cls,
        "_ng_failure_terminal": terminal,
        "_ng_failure_delivery": delivery,
        "_ng_failure_max_attempts": 3,
        "failure_kind": extra.pop("kind", None),
        **stamps(task, rollout, attempt),
        **extra,
    }


def omitted(task: int, rollout: int, attempt: int = 0, *, drained: bool = False) -> dict[str, Any]:
    """Return an ``_ng_omitted_rollout`` row (interrupted, or never started)."""
    row: dict[str, Any] = {
        "_ng_failure_class": "cancelled",
        "_ng_failure_terminal": False,
        "failure_kind": "drained" if drained else "interrupted",
        "_ng_omitted_rollout": True,
        **stamps(task, rollout, attempt),
    }
    if drained:
        row["_ng_dispatch_drained"] = True
        row["_ng_no_persist"] = True
    return row


class Folder:
    """A run folder under construction."""

    def __init__(self, root: Path, keys: Iterable[tuple[int, int]]) -> None:
        self.layout = RunLayout.for_output(root / "r.jsonl")
        root.mkdir(parents=True, exist_ok=True)
        self.keys = list(keys)
        write_jsonl(self.layout.materialized_inputs, [row_body(t, r) for t, r in self.keys])

    def land(self, *rows: dict[str, Any]) -> Folder:
        """Append success rows."""
        append_jsonl(self.layout.rollouts, rows)
        return self

    def fail(self, *rows: dict[str, Any]) -> Folder:
        """Append sidecar rows."""
        append_jsonl(self.layout.failures, rows)
        return self

    def reserve(self, *triples: tuple[int, int, int]) -> Folder:
        """Append one ledger line."""
        with open(self.layout.attempts, "ab") as f:
            f.write(encode_reservation(list(triples)))
        return self

    def release(self, *triples: tuple[int, int, int]) -> Folder:
        """Append one ledger line releasing numbers that were never sent."""
        with open(self.layout.attempts, "ab") as f:
            f.write(encode_release(list(triples)))
        return self
