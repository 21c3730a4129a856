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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from ..errors import ConfigError, InputError
from ..health import HealthReport, HealthSettings, check_run, parse_ignored, run_after
from ..text import visible

if TYPE_CHECKING:
    from ..metrics import AggregateResult

__all__ = ["HEALTH_OPTIONS", "after_run", "health_check", "health_options"]

F = TypeVar("F", bound=Callable[..., Any])

# collect's and aggregate's switches of the post-run health check (NeMo Gym's spellings); each
# sets the NeMo Gym key of the same meaning, so +key=value and a config file work alike.
HEALTH_OPTIONS: dict[str, Callable[[F], F]] = {
    "no-health-check": click.option(
        "--no-health-check",
        "disable_health_check",
        is_flag=True,
        default=None,
        help="Skip the rollout health check after the run (+disable_health_check=true).",
    ),
    "health-check-ignore": click.option(
        "--health-check-ignore",
        "health_check_ignored_checks",
        metavar="CHECK[,CHECK...]",
        help="Health checks to leave out of the verdicts (+health_check_ignored_checks=[...]).",
    ),
    "health-check-workers": click.option(
        "--health-check-workers",
        "health_check_workers",
        type=int,
        help="Worker processes of the health check (+health_check_workers=N; default 1).",
    ),
}


def health_options(f: F) -> F:
    """Attach the three health switches (aggregate's; collect takes them as run options)."""
    for option in reversed(HEALTH_OPTIONS.values()):
        f = option(f)
    return f


def after_run(
    rollouts_files: Sequence[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    settings: Any,
    aggregate: AggregateResult | None = None,
    observe: Callable[[HealthReport], None] | None = None,
) -> list[str]:
    """Run the health step after collect or aggregate; return the lines to print.

    ``settings``: a `RunConfig`, or a mapping of NeMo Gym's keys. The HTML report, when the
    aggregation wrote one, is written again with its health section; ``observe`` gets the
    report (`health.run_after`). Never raises: a failure
    is one line (`health.run_after`), and so is a report that cannot be rewritten.
    """
    try:
        health = (
            HealthSettings.from_values(settings)
            if isinstance(settings, Mapping)
            else HealthSettings.of(settings)
        )
    except ConfigError as exc:
        return [f"Rollout health: not checked ({visible(str(exc))})"]
    report, lines = run_after(rollouts_files, out_dir, health, observe)
    if report is not None and aggregate is not None and aggregate.report_path is not None:
        from ..metrics.report_html import write_report

        try:
            write_report(aggregate.report_path, aggregate, health=report)
        except OSError as exc:
            lines.append(f"report: health section not added ({visible(str(exc))})")
    return lines


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
    from .common import fail  # common attaches HEALTH_OPTIONS to collect: import it late

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
