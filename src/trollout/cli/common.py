"""The option table of a run, shared by the commands, and the ``--progress`` mapping.

Every option of a run is defined once here (`_RUN_OPTIONS`); commands pick theirs by name
(`run_options`). Exit codes and error printing are in `failures`, the config assembly in
`run_config`, the summary in `progress`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from .health_options import HEALTH_OPTIONS

__all__ = ["collect_options", "live_mode", "run_options"]

F = TypeVar("F", bound=Callable[..., Any])


# Every option of a run, once; commands pick theirs by name (`run_options`).
_RUN_OPTIONS: dict[str, Callable[[Any], Any]] = {
    "output": click.option(
        "-o",
        "--output",
        "output_jsonl_fpath",
        type=click.Path(dir_okay=False),
        help="Rollouts file to write; its siblings hold failures, inputs, status.",
    ),
    "config": click.option(
        "--config",
        "config_file",
        type=click.Path(exists=True, dir_okay=False),
        help="YAML file of settings (NeMo Gym key names).",
    ),
    "overwrite": click.option(
        "--overwrite",
        is_flag=True,
        default=None,
        help="Start afresh even if the output folder holds a run: its files are deleted, but "
        "only once the new run's inputs are written (without it such a run is refused).",
    ),
    "head-server": click.option(
        "--head-server", help="Head server URL (default http://127.0.0.1:11000)."
    ),
    "agent-url": click.option(
        "--agent-url",
        "agent_urls",
        multiple=True,
        metavar="NAME=URL",
        help="Send agent NAME's rollouts to URL (http://host:port); no head server needed. "
        "Repeatable.",
    ),
    "allow-env": click.option(
        "--allow-env",
        "served_config_env_allow",
        multiple=True,
        metavar="NAME",
        help="Let the head server's config read environment variable NAME through "
        "${oc.env:NAME} (repeatable; none by default: it may name any secret of this "
        "environment). Its value is used to connect, never shown.",
    ),
    "max-line-bytes": click.option(
        "--max-line-bytes",
        "max_input_line_bytes",
        type=int,
        help="Refuse input lines longer than this many bytes (default 64 MiB).",
    ),
    "agent": click.option("--agent", "agent_name", help="Route every row to this agent."),
    "limit": click.option("--limit", type=int, help="Keep the rows of the first N tasks."),
    "num-repeats": click.option(
        "--num-repeats", type=int, help="Rollouts per task row (default 1)."
    ),
    "concurrency": click.option(
        "--concurrency",
        "num_samples_in_parallel",
        type=int,
        help="Requests in flight at most (num_samples_in_parallel, default 64).",
    ),
    "max-rollouts": click.option(
        "--max-rollouts",
        "max_rollouts",
        type=int,
        help="Refuse plans of more rollouts than this (default 10,000,000): a typo in "
        "--num-repeats must not fill the disk.",
    ),
    "max-resident": click.option(
        "--max-resident",
        "max_resident_rollout_tasks",
        type=int,
        help="Rollout tasks alive at once (default: the concurrency).",
    ),
    "add-seed": click.option(
        "--add-seed/--no-add-seed",
        "num_repeats_add_seed",
        default=None,
        help="Put a seed in responses_create_params.metadata.extra_body.",
    ),
    "seed": click.option("--seed", type=int, help="Run seed for seeding rollouts (default 0)."),
    "seed-mode": click.option(
        "--seed-mode",
        type=click.Choice(["hash", "rollout-index"]),
        help="NeMo Gym's rollout index (default) or hash(run seed, task, rollout).",
    ),
    "interleave-repeats": click.option(
        "--interleave-repeats/--no-interleave-repeats",
        default=None,
        help="Dispatch abcabc instead of aabbcc.",
    ),
    "connect-timeout": click.option(
        "--connect-timeout",
        "connect_timeout_s",
        type=float,
        help="Seconds to establish a connection (default 10).",
    ),
    "read-timeout": click.option(
        "--read-timeout",
        "read_timeout_s",
        type=float,
        help="Seconds of silence allowed while waiting for a reply (default 3600).",
    ),
    "reply-timeout": click.option(
        "--reply-timeout",
        "reply_timeout_s",
        type=float,
        help="Seconds one request may take from sending to the last reply byte, however "
        "steadily bytes arrive (default: twice --read-timeout, 7200).",
    ),
    "max-reply-bytes": click.option(
        "--max-reply-bytes",
        "max_reply_bytes",
        type=int,
        help="Longest reply body read, after decoding; a longer one fails the rollout "
        "(default 268435456, 256 MiB).",
    ),
    "fsync": click.option(
        "--fsync",
        type=click.Choice(["row", "batch", "never"]),
        help="When rows are fsynced (default batch); never: no file is, not even the manifest.",
    ),
    "fail-fast": click.option(
        "--fail-fast/--no-fail-fast",
        default=None,
        help="Stop the run at the first failed rollout (NeMo Gym's old default).",
    ),
    "rollout-timeout": click.option(
        "--rollout-timeout",
        "rollout_timeout_s",
        type=float,
        help="Seconds one rollout may take, retries included (default: no limit).",
    ),
    "retry-requests": click.option(
        "--retry-requests/--no-retry-requests",
        default=None,
        help="Re-send requests that may have been delivered, as new attempts.",
    ),
    "budget": click.option(
        "--budget",
        "dispatch_budget_s",
        type=float,
        help="Start new rollouts only during this many seconds (dispatch_budget_s; > 0).",
    ),
    "drain-margin": click.option(
        "--drain-margin",
        "drain_margin_s",
        type=float,
        help="Stop starting this long before the budget ends (default: p75 of rollouts).",
    ),
    "max-run-time": click.option(
        "--max-run-time",
        "max_run_time_s",
        type=float,
        help="Wall-clock seconds for the run: then stop starting, wait --grace, cancel.",
    ),
    "grace": click.option(
        "--grace",
        "grace_s",
        type=float,
        help="Seconds rollouts in flight get after a stop (signal, --max-run-time; default 30).",
    ),
    "require-complete": click.option(
        "--require-complete/--no-require-complete",
        default=None,
        help="Fail (exit 75/76) instead of scoring a run whose rollouts did not all land.",
    ),
    "no-aggregate": click.option(
        "--no-aggregate",
        "disable_aggregation",
        is_flag=True,
        default=None,
        help="Skip the metrics at the end of the run.",
    ),
    "otlp-endpoint": click.option(
        "--otlp-endpoint",
        "otlp_endpoint",
        help="Send traces and metrics over OTLP/HTTP to this URL (default: "
        "OTEL_EXPORTER_OTLP_ENDPOINT; unset: no telemetry).",
    ),
    "metrics-port": click.option(
        "--metrics-port",
        "metrics_port",
        type=int,
        help="Serve Prometheus metrics on this port, and the final values --metrics-linger "
        "s after the run (0: any free port; not with --ray: use --otlp-endpoint there).",
    ),
    "metrics-linger": click.option(
        "--metrics-linger",
        "metrics_linger_s",
        type=float,
        help="Seconds the final metrics are served after the run (default 60; 0: none).",
    ),
    "metrics-host": click.option(
        "--metrics-host",
        "metrics_host",
        help="Address the Prometheus endpoint binds (default 127.0.0.1, loopback only).",
    ),
    "progress": click.option(
        "--progress",
        "live",
        type=click.Choice(["auto", "live", "plain"]),
        default="auto",
        show_default=True,
        help="Live display on a terminal, periodic lines otherwise.",
    ),
}


def run_options(*names: str) -> Callable[[F], F]:
    """Return a decorator attaching the named run options, in the order given."""
    unknown = [name for name in names if name not in _RUN_OPTIONS]
    if unknown:  # pragma: no cover - a programming error caught by any CLI test
        raise KeyError(f"no run options {unknown!r}")

    def attach(f: F) -> F:
        for name in reversed(names):
            f = _RUN_OPTIONS[name](f)
        return f

    return attach


_RUN_OPTIONS.update(HEALTH_OPTIONS)  # --no-health-check, --health-check-ignore, -workers
collect_options = run_options(*_RUN_OPTIONS)
"""The options of a collection run (collect and demo take them all)."""


def live_mode(value: str) -> bool | None:
    """Map ``--progress`` to the reporter's ``live`` flag (None: decide by terminal)."""
    return {"auto": None, "live": True, "plain": False}[value]
