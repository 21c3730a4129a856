"""Fault scripts: the fault hook as a table, in memory or in a JSON Lines file.

A script maps ``(run id, task, rollout, attempt, request)`` to the `Fault` that request meets
(run id None: any run), so a property test can say exactly what each request of each attempt
gets, and the fake in its own process can follow the same script from a file
(``python -m trollout.testing serve --fault-script FILE``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import attrs
import orjson

from ..errors import ConfigError
from .faults import Fault, FaultContext, fault_from_dict

__all__ = ["FaultScript", "ScriptKey", "fault_to_dict", "read_fault_script", "write_fault_script"]

ScriptKey = tuple[str | None, int, int, int, int]  # run id, task, rollout, attempt, request


class FaultScript:
    """The fault hook as a script: one fault per (run, task, rollout, attempt, request).

    A JSON Lines file, one entry per line::

        {"task": 3, "rollout": 0, "attempt": 0, "request": 1, "fault": {"kind": "status",
         "status": 429, "retry_after": 0.1}}

    ``rollout``, ``attempt`` and ``request`` default to 0; ``run_id`` (optional) limits the
    entry to the rollouts of one batch (their ``_ng_run_id``), so one long-lived fake can serve
    many scripts. Requests the script does not name are answered normally. The file is re-read
    whenever it changes (size, time or inode), so a test may append the next script while the
    fake runs.

    Args:
        path: the script file (None: only ``entries``).
        entries: entries given in memory (in-process fakes), as ``{key: fault}``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        entries: Mapping[ScriptKey, Fault] | None = None,
    ) -> None:
        self.path = None if path is None else os.fspath(path)
        self._entries: dict[ScriptKey, Fault] = dict(entries or {})
        self._file: dict[ScriptKey, Fault] = {}
        self._seen: tuple[int, int, int] | None = None

    def __call__(self, context: FaultContext) -> Fault | None:
        """Return the fault scripted for this request, or None."""
        self._reload()
        rest = (
            context.task_index,
            context.rollout_index,
            context.attempt_index,
            context.request_index,
        )
        for table in (self._entries, self._file):
            fault = table.get((context.run_id, *rest)) or table.get((None, *rest))
            if fault is not None:
                return fault
        return None

    def _reload(self) -> None:
        if self.path is None:
            return
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._file, self._seen = {}, None
            return
        seen = (st.st_mtime_ns, st.st_size, st.st_ino)
        if seen != self._seen:
            self._file, self._seen = read_fault_script(self.path), seen


def _entry_key(data: Mapping[str, Any], where: str) -> ScriptKey:
    try:
        run_id = data.get("run_id")
        key = tuple(int(data.get(name, 0)) for name in ("task", "rollout", "attempt", "request"))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: task, rollout, attempt and request must be integers") from exc
    if run_id is not None and not isinstance(run_id, str):
        raise ConfigError(f"{where}: run_id must be a string (got {run_id!r})")
    return (run_id, *key)  # type: ignore[return-value]


def read_fault_script(path: str | os.PathLike[str]) -> dict[ScriptKey, Fault]:
    """Read a fault script file into ``{(run, task, rollout, attempt, request): fault}``.

    Raises:
        ConfigError: a line is not an entry (naming the file and line).
    """
    faults: dict[ScriptKey, Fault] = {}
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{os.fspath(path)}:{number}"
            try:
                data = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise ConfigError(f"{where}: not JSON ({exc}); write one entry per line") from exc
            if not isinstance(data, Mapping) or "fault" not in data:
                raise ConfigError(f"{where}: an entry needs a 'fault' mapping (got {data!r})")
            faults[_entry_key(data, where)] = fault_from_dict(data["fault"], where=where)
    return faults


def write_fault_script(
    path: str | os.PathLike[str], entries: Mapping[ScriptKey, Fault], *, append: bool = False
) -> None:
    """Write (or append) ``{(run, task, rollout, attempt, request): fault}`` as a script file."""
    lines = []
    for (run_id, task, rollout, attempt, request), fault in entries.items():
        entry: dict[str, Any] = {"task": task, "rollout": rollout, "attempt": attempt}
        entry |= {"request": request, "fault": fault_to_dict(fault)}
        if run_id is not None:
            entry["run_id"] = run_id
        lines.append(orjson.dumps(entry) + b"\n")
    with open(path, "ab" if append else "wb") as f:
        f.write(b"".join(lines))


def fault_to_dict(fault: Fault) -> dict[str, Any]:
    """Return a fault as the mapping `fault_from_dict` reads (defaults left out)."""
    out: dict[str, Any] = {"kind": fault.kind.value}
    for a in attrs.fields(Fault):
        value = getattr(fault, a.name)
        if a.name != "kind" and value != a.default:
            out[a.name] = list(value) if isinstance(value, tuple) else value
    return out
