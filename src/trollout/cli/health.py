"""``trollout health-check RUN_DIR``: judge a finished run's rollouts (NeMo Gym's health check).

The command ``gym eval health-check`` is, with its options, messages and exit codes: it reads
``RUN_DIR/rollouts.jsonl`` (or ``--rollouts-file``, relative to RUN_DIR), writes
``quality_summary.json`` and ``rollout_verdicts.jsonl`` into RUN_DIR and prints the two report
lines, or the summary on one line with ``--json``. Exit codes: 0 done, unhealthy rollouts
included (a verdict is data, not a failure); 2 a usage error (no such directory or file, an
unknown check id, ``--workers`` < 1, a ``+key=value`` override), with nothing written. The work
is `trollout.health.check_run`; docs/health.md describes the checks.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from ..errors import ConfigError, InputError
from ..health import check_run, parse_ignored
from .failures import fail

__all__ = ["health_check"]


def _default_workers() -> int:
    return min(os.cpu_count() or 1, 8)  # NeMo Gym's default; small files are checked inline


@click.command(
    "health-check",
    context_settings={"ignore_unknown_options": True},
    help="Verify rollout quality for an existing run directory.\n\n"
    "Writes quality_summary.json and rollout_verdicts.jsonl into RUN_DIR (docs/health.md).",
)
@click.argument("run_dir", metavar="RUN_DIR")
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
@click.option(
    "--rollouts-file",
    metavar="PATH",
    default="rollouts.jsonl",
    show_default=True,
    help="Rollout JSONL path; relative paths resolve under RUN_DIR.",
)
@click.option(
    "--workers",
    type=int,
    default=None,
    help="Number of worker processes (default: the CPU count, at most 8).",
)
@click.option(
    "--ignore-checks",
    "--ignore",
    "ignore",
    multiple=True,
    metavar="CHECK[,CHECK...]",
    help="Comma-separated check IDs to exclude from verdict derivation.",
)
@click.option("--json", "as_json", is_flag=True, help="Output as machine-readable JSON.")
def health_check(run_dir: str, extra: tuple[str, ...], **opts: Any) -> None:

    if extra:
        if any(token.startswith("+") or "=" in token for token in extra):
            fail("health-check does not accept Hydra overrides")
        fail(f"unexpected argument {extra[0]!r}; give one RUN_DIR")
    folder = Path(os.path.abspath(run_dir))
    if not folder.is_dir():
        fail(f"Run directory not found: {folder}")
    rollouts = folder / opts["rollouts_file"]
    if not rollouts.is_file():
        fail(f"Rollout JSONL not found: {rollouts}")
    workers = opts["workers"] if opts["workers"] is not None else _default_workers()
    if workers < 1:
        fail(f"--workers must be >= 1 (got {workers})")
    try:
        ignored = parse_ignored(",".join(opts["ignore"]))
        report = check_run(rollouts, folder, ignored_checks=ignored, workers=workers)
    except (ConfigError, InputError) as exc:
        fail(str(exc))
    if opts["as_json"]:
        import json

        click.echo(json.dumps(report.summary, separators=(",", ":")))
    else:
        for line in report.lines():
            click.echo(line)
