"""What a run was, from its small files: manifest, batch status and aggregate metrics.

Each is read whole (they are written atomically, never appended) and remembered until its size
or modification time changes. Only what the run page shows is kept: the aggregate metrics file
of a 100,000-rollout run lists every rollout; its per-group estimates are a few hundred bytes.
A file that cannot be read or parsed is reported on the page, never raised.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import orjson

from ..errors import RunFolderError
from ..recovery.layout import RunLayout
from .runs import open_run_file

__all__ = ["FileCache", "reduce_metrics", "small_files"]

MAX_SMALL_FILE: Final = 256 << 20  # a manifest, status or metrics file larger is not read


class FileCache:
    """One small JSON file, parsed and reduced once per change of its size or mtime."""

    def __init__(self, path: Path, reduce: Callable[[Any], Any] = lambda x: x) -> None:
        self.path = path
        self._reduce = reduce
        self._stamp: tuple[int, int] | None = None
        self._value: Any = None
        self.problem = ""

    def get(self) -> Any:
        """The reduced content, or None when the file is absent or unreadable (`problem`)."""
        try:
            f = open_run_file(self.path)
        except RunFolderError as exc:
            self._stamp, self._value, self.problem = None, None, str(exc)
            return None
        if f is None:
            self._stamp, self._value, self.problem = None, None, ""
            return None
        with f:
            st = os.fstat(f.fileno())
            stamp = (st.st_size, st.st_mtime_ns)
            if stamp == self._stamp:
                return self._value
            if st.st_size > MAX_SMALL_FILE:
                self.problem = f"{str(self.path)!r} is {st.st_size:,} bytes: too large to show"
                self._stamp, self._value = stamp, None
                return None
            data = f.read()
        try:
            self._value, self.problem = self._reduce(orjson.loads(data)), ""
        except Exception as exc:  # a damaged file is shown as a problem, never raised
            self._value = None
            self.problem = f"{str(self.path)!r} could not be read ({type(exc).__name__})"
        self._stamp = stamp
        return self._value


_ESTIMATE_KEYS: Final = ("value", "ci_low", "ci_high", "tasks", "ci_method")


def reduce_metrics(data: Any) -> list[dict[str, Any]]:
    """Keep, per group of an aggregate metrics file, its name, coverage and estimates."""
    if not isinstance(data, list):
        raise ValueError("not a list of groups")
    groups = []
    for entry in data:
        if not isinstance(entry, dict):
            continue
        block = entry.get("trollout")
        block = block if isinstance(block, dict) else {}
        ref = entry.get("agent_ref")
        name = ref.get("name") if isinstance(ref, dict) else None
        group: dict[str, Any] = {
            "agent": name if isinstance(name, str) else None,
            "environment_server": _str(entry.get("_ng_environment_server")),
            "coverage": _dict(block.get("coverage")),
            "key_metrics": _numbers(entry.get("key_metrics")),
        }
        for view in ("failures_excluded", "failures_as_zero"):
            estimates = block.get(view)
            if isinstance(estimates, dict):
                group[view] = {
                    name: {k: e.get(k) for k in _ESTIMATE_KEYS}
                    for name, e in estimates.items()
                    if isinstance(e, dict) and ("@" in name or name == "mean_reward")
                }
        groups.append(group)
    return groups


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _numbers(value: Any) -> dict[str, float]:
    if not isinstance(value, dict):
        return {}
    return {
        k: v
        for k, v in list(value.items())[:40]
        if isinstance(v, int | float) and not isinstance(v, bool)
    }


def small_files(layout: RunLayout) -> dict[str, FileCache]:
    """The manifest, batch status and aggregate metrics caches of one shard."""
    return {
        "manifest": FileCache(layout.manifest),
        "status": FileCache(layout.batch_status, _status),
        "metrics": FileCache(layout.aggregate_metrics, reduce_metrics),
    }


def _status(data: Any) -> dict[str, Any]:
    """A batch status without its per-rollout list (the index has every rollout)."""
    if not isinstance(data, dict):
        raise ValueError("not an object")
    return {k: v for k, v in data.items() if k != "rollouts"}
