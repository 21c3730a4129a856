"""`trollout collect`: parse the options, run the run layer, print what happened.

The run is composed in `trollout.run` (`trollout.run.collect`); the command line builds the
config (`run_config.build_run_config`), sends the run to Ray or to this process
(`scaleout.collect_any`), and prints the summary, timing report and metrics (`report_run`),
exiting as the run ended. `collect_run` (`session`) is the run layer with the command line's
console and signal watcher, re-exported here for the code that always imported it from here.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import attrs
import click
from rich.console import Console

from ..errors import ConfigError
from ..metrics import print_report
from ..run.compose import RunResult
from ..settings import RunConfig
from ..text import visible
from .common import collect_options, live_mode
from .failures import EXIT_FAILED, fail, run_trio
from .progress import print_summary
from .run_config import build_run_config
from .scaleout import collect_any, scaleout_options
from .session import collect_run
from .view import view_command

__all__ = ["RunResult", "collect", "collect_run", "report_run", "resume_options"]

F = TypeVar("F", bound=Callable[..., Any])


def resume_options(f: F) -> F:
    """Attach the options that steer a resume (shared by collect, resume and resubmit)."""
    options = [
        click.option(
            "--allow-unsafe-resume",
            is_flag=True,
            default=None,
            help="Resume even if the input, plan settings or agent set changed (the saved "
            "materialized rows are still what is dispatched).",
        ),
        click.option(
            "--max-attempts",
            type=int,
            help="Attempts per rollout before it counts as done (default: env "
            "NEMO_GYM_MAX_ROLLOUT_ATTEMPTS, else 3).",
        ),
        click.option(
            "--retry-terminal-timeouts",
            is_flag=True,
            default=None,
            help="Retry rollouts whose terminal failure was a timeout.",
        ),
        click.option(
            "--no-retry-failed",
            "retry_failed_on_resume",
            flag_value=False,
            default=None,
            help="Resume only rollouts that never finished (interrupted or never started); "
            "retryable failures stay failures (+retry_failed_on_resume=false).",
        ),
        click.option(
            "--longest-first",
            "dispatch_longest_first",
            is_flag=True,
            default=None,
            help="Dispatch the rollouts that took longest before first.",
        ),
        click.option(
            "--record-omitted",
            "record_omitted_rollouts",
            is_flag=True,
            default=None,
            help="Write a row for each interrupted or never-started attempt.",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED, metavar="INPUT [+key=value ...]")
@collect_options
@click.option(
    "--resume",
    "resume_from_cache",
    is_flag=True,
    default=None,
    help="Resume the run in the output folder (+resume_from_cache=true): dispatch "
    "only what is not done; a folder with no outcomes starts afresh.",
)
@click.option(
    "--observability",
    "observability_enabled",
    is_flag=True,
    default=None,
    help="Merge each rollout's model-call capture (+observability_enabled=true).",
)
@click.option("--model-call-capture-dir", help="The model servers' capture dir (absolute).")
@resume_options
@scaleout_options
def collect(args: tuple[str, ...], live: str, **options: Any) -> None:
    """Collect rollouts for every task row of INPUT (a JSONL file).

    Each rollout is one POST /run to the agent (or the environment server fronting it); the
    outcome lands in the output file (successes), OUT_failures.jsonl (typed failures) or nowhere
    (kill-shaped replies). Any NeMo Gym setting can be given as +key=value, for example
    +num_repeats=4 +agent_map={math:math_agent}.
    """
    options = {k: v for k, v in options.items() if v is not None and v != ()}
    try:
        config = build_run_config(args, options)
    except ConfigError as exc:
        fail(str(exc))
    result: RunResult = run_trio(_collect, config, live_mode(live))
    report_run(result, title=f"trollout collect: {Path(result.layout.rollouts).name}")


def report_run(result: RunResult, *, title: str) -> None:
    """Print a session's summary, timing report and metrics; exit as the run ended.

    With a Prometheus endpoint, it keeps serving the final values for ``metrics_linger_s``
    after everything is printed (not after a stop by signal; Ctrl-C ends the wait).
    Exit codes: 128 + the signal after SIGINT/SIGTERM (130/143); 1 when ``--max-run-time``
    ended the run or a server's metrics call failed; otherwise return (exit 0).
    """
    tally = result.resumed
    shown = result if tally is None else attrs.evolve(result, expected=tally.to_dispatch)
    print_summary(shown, title=title)
    if tally is not None:
        done = tally.expected - tally.to_dispatch
        click.echo(
            f"resumed: {done} of {tally.expected} rollouts were done "
            f"({tally.fates['landed']} landed); dispatched {tally.to_dispatch}"
        )
    click.echo(result.timing)
    for line in result.differences:
        click.echo(f"differs from NeMo Gym: {line}")
    if result.aggregate is not None:
        print_report(result.aggregate, Console())
        click.echo(f"metrics: {visible(str(result.aggregate.metrics_path))}")
        if result.aggregate.report_path is not None:
            click.echo(f"report:  {visible(str(result.aggregate.report_path))}")
    for line in result.health:
        click.echo(visible(line))
    click.echo(f"view:    {visible(view_command(result.layout.output))}")
    if result.telemetry is not None and result.signal is None:
        run_trio(result.telemetry.linger)  # the last step: final values stay scrapeable
    if result.signal is not None:
        click.echo(f"stopped by {signal.Signals(result.signal).name}; resume to finish", err=True)
        sys.exit(128 + result.signal)
    if result.deadline_reached:
        fail("--max-run-time reached before every rollout ran; resume to finish", EXIT_FAILED)
    if result.aggregate is not None and not result.aggregate.ok:
        fail(
            "a server's /aggregate_metrics call failed (see above); local metrics were written",
            EXIT_FAILED,
        )


async def _collect(config: RunConfig, live: bool | None) -> RunResult:
    return await collect_any(config, live)  # --ray goes to Ray, the rest to collect_run
