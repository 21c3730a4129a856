"""``<stem>_aggregate_metrics.json``: NeMo Gym's list shape, written as a stream.

One entry per group (docs/protocol.md section 4)::

    {"agent_ref": {"name": ...}, "_ng_environment_server": ...,   # the latter when known
     "agent_metrics": {...}, "key_metrics": {...}, "group_level_metrics": [...],
     ...                                  # other keys of a server's reply, as it sent them
     "aggregation_error": "...",          # only when the server call failed
     "export_metrics": {...},             # NeMo Gym's exporter names (`exports`)
     "trollout": {...}}                   # ours: coverage, both views, local metrics

The collections come from the server's reply when a server answered, from the local default
metrics when no server was asked, and are empty when the call failed. The ``trollout`` key
holds what NeMo Gym's readers do not know about (they ignore unknown keys, as they ignore
``repeat_level_metrics``).

``group_level_metrics`` has one entry per task, so for large runs it is the bulk of the file:
entries are generated and written one at a time (indent 2, like NeMo Gym's ``json.dump``), and
the file is renamed into place once complete.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import orjson

from ..records import AGENT_REF, ENVIRONMENT_SERVER
from ..recovery.files import atomic_write
from .default_metrics import group_level_metrics, key_metrics
from .reader import Collection
from .summary import GroupSummary
from .views import AS_ZERO, EXCLUDED

__all__ = ["metrics_entries", "write_metrics_file"]

_COLLECTIONS = ("agent_metrics", "key_metrics", "group_level_metrics")


def metrics_entries(
    summaries: Iterable[GroupSummary], collection: Collection
) -> Iterator[dict[str, Any]]:
    """Yield the file's entries; a local entry's ``group_level_metrics`` is a generator."""
    for summary in summaries:
        entry: dict[str, Any] = {AGENT_REF: {"name": summary.agent}}
        if summary.environment_server is not None:
            entry[ENVIRONMENT_SERVER] = summary.environment_server
        entry.update(_collections(summary, collection))
        if summary.aggregation_error is not None:
            entry["aggregation_error"] = summary.aggregation_error
        entry["export_metrics"] = summary.exports
        entry["trollout"] = _ours(summary)
        yield entry


def _collections(summary: GroupSummary, collection: Collection) -> dict[str, Any]:
    server = summary.server
    if server is not None and server.reply is not None:
        reply = dict(server.reply)
        head = {name: reply.pop(name) for name in _COLLECTIONS}
        return head | reply
    if server is not None:
        return {"agent_metrics": {}, "key_metrics": {}, "group_level_metrics": []}
    landed = collection.groups[summary.key]
    imputed = collection.imputed.get(summary.key)
    return {
        "agent_metrics": summary.local_metrics,
        "key_metrics": key_metrics(summary.local_metrics),
        "group_level_metrics": group_level_metrics(landed, imputed),
    }


def _ours(summary: GroupSummary) -> dict[str, Any]:
    ours: dict[str, Any] = {
        "metrics_source": summary.metrics_source,
        "coverage": summary.coverage.to_json(),
        EXCLUDED: summary.excluded.to_json(),
        AS_ZERO: summary.as_zero.to_json(),
    }
    if summary.server is not None:
        ours["local_agent_metrics"] = summary.local_metrics
    return ours


def write_metrics_file(path: Path, entries: Iterable[Mapping[str, Any]]) -> None:
    """Write entries as an indented JSON list, streaming generator values; replace atomically."""
    with atomic_write(path) as f:
        _write_list(f, entries, _write_entry, indent=0)
        f.write(b"\n")


def _write_entry(f: IO[bytes], entry: Mapping[str, Any], indent: int) -> None:
    if not entry:
        f.write(b"{}")
        return
    pad = b"\n" + b" " * (indent + 2)
    f.write(b"{")
    for i, (key, value) in enumerate(entry.items()):
        f.write((b"," if i else b"") + pad + orjson.dumps(key) + b": ")
        if isinstance(value, Iterator):
            _write_list(f, value, _write_value, indent + 2)
        else:
            _write_value(f, value, indent + 2)
    f.write(b"\n" + b" " * indent + b"}")


def _write_value(f: IO[bytes], value: Any, indent: int) -> None:
    text = orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)
    f.write(text.replace(b"\n", b"\n" + b" " * indent))


def _write_list(f: IO[bytes], items: Iterable[Any], write: Any, indent: int) -> None:
    pad = b"\n" + b" " * (indent + 2)
    wrote = False
    f.write(b"[")
    for item in items:
        f.write((b"," if wrote else b"") + pad)
        write(f, item, indent + 2)
        wrote = True
    f.write(b"\n" + b" " * indent + b"]" if wrote else b"]")
