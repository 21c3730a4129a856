"""Helpers for the distributed-run tests: one-machine references and what must match them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from builders import invoke, read_jsonl

# Keys whose values depend on when and how long a rollout ran, never on what it computed.
TIMING = ("elapsed", "seconds", "latency", "duration", "_at", "wall", "per_s", "rate")


def collect_args(source: Path, output: Path, head: str, *extra: str) -> list[str]:
    """Return the collect command line every run of these tests shares (2 repeats, seeds)."""
    return [
        "collect",
        str(source),
        "-o",
        str(output),
        "--head-server",
        head,
        "--agent",
        "math_agent",
        "--num-repeats",
        "2",
        "--add-seed",
        "--progress",
        "plain",
        *extra,
    ]


def collect(source: Path, output: Path, head: str, *extra: str) -> str:
    """Run collect in process; return its output (assert exit 0)."""
    result = invoke(*collect_args(source, output, head, *extra))
    assert result.exit_code == 0, result.output
    return result.output


def untimed(value: Any) -> Any:
    """Return a JSON value with every timing key (at any depth) removed."""
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if not any(t in k.lower() for t in TIMING)}
    if isinstance(value, list):
        return [untimed(v) for v in value]
    return value


def metrics(output: Path) -> Any:
    """Return a run's ``_aggregate_metrics.json`` without its timing keys."""
    path = output.with_name(output.name.removesuffix(".jsonl") + "_aggregate_metrics.json")
    return untimed(orjson.loads(path.read_bytes()))


def rollout_set(output: Path) -> set[bytes]:
    """Return the landed rollouts of a run: identity and result, without timing stamps."""
    rows = read_jsonl(output)
    keys = [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows]
    assert len(keys) == len(set(keys)), "a rollout landed twice"
    drop = ("elapsed_seconds", "_ng_attempt_index")
    return {
        orjson.dumps({k: v for k, v in r.items() if k not in drop}, option=orjson.OPT_SORT_KEYS)
        for r in rows
    }
