"""`trollout resume RUN` and `trollout resubmit RUN`: continue a run with its saved settings.

RUN is the run's output file (or its manifest, or a folder holding one run). Both commands read
the settings saved in the run's manifest, apply the options and ``+key=value`` overrides given
now (say a new ``--head-server`` after the deployment moved), and call `collect_run` with
``resume_from_cache``. An override that changes the materialized rows (``+num_repeats=8``)
is refused like any other change, unless ``--allow-unsafe-resume``. The saved settings come
from the run layer (`trollout.run.saved_settings`, the library's `resume` reads them the
same way); this module adds the command line's options and sends the run where it ran (Ray or
this process, `scaleout.collect_any`).

- ``resume`` dispatches what docs/protocol.md section 8 says is not done: missing rollouts and
  retryable failures under the attempt cap, each with a new attempt number.
- ``resubmit`` also dispatches rollouts that are done without having landed: terminal
  failures, failures counted as zero and rollouts at the attempt cap, once more each, past
  the cap; ``--class C`` (repeatable) limits it to rollouts whose latest failure is of class C.
  A landed rollout is never dispatched again.
"""

from __future__ import annotations

from typing import Any

import click

from ..errors import ConfigError, TrolloutError
from ..recovery.resume import Resubmit
from ..run.compose import RunResult
from ..run.resumption import saved_settings
from ..settings import RunConfig
from .collect import report_run, resume_options
from .common import live_mode, run_options
from .failures import fail, run_trio
from .run_config import build_run_config
from .scaleout import collect_any, ray_options

__all__ = ["config_from_run", "resubmit", "resume"]

_CONTEXT = {"ignore_unknown_options": True, "allow_extra_args": True}


def _session_options(f: Any) -> Any:
    """Attach the options a resumed session may change (deployment, concurrency, time, I/O)."""
    f = run_options(
        "head-server",
        "agent-url",
        "allow-env",
        "concurrency",
        "max-resident",
        "connect-timeout",
        "read-timeout",
        "rollout-timeout",
        "retry-requests",
        "budget",
        "drain-margin",
        "max-run-time",
        "grace",
        "require-complete",
        "no-aggregate",
        "fsync",
        "otlp-endpoint",
        "metrics-port",
        "metrics-host",
        "progress",
    )(f)
    f = click.argument("overrides", nargs=-1, type=click.UNPROCESSED, metavar="[+key=value ...]")(f)
    f = click.argument("run", type=click.Path(exists=True))(f)
    return ray_options(resume_options(f))


def config_from_run(run: str, options: dict[str, Any], overrides: tuple[str, ...]) -> RunConfig:
    """Build the config of a resumed session: saved settings < the command line.

    RUN gives the output and asks for a resume; an override of either is refused as given
    twice (`settings.load_run_config`).

    Raises:
        ConfigError: RUN has no manifest, an override is not ``+key=value``, or a bad value.
    """
    layout, saved = saved_settings(run)
    bad = [token for token in overrides if not token.startswith("+")]
    if bad:
        raise ConfigError(f"unexpected arguments {bad!r}; settings go as +key=value")
    given = {k: v for k, v in options.items() if v is not None and v != ()}
    given["output_jsonl_fpath"] = str(layout.output)
    given["resume_from_cache"] = True
    labels = {"output_jsonl_fpath": "RUN", "resume_from_cache": "trollout resume"}
    return build_run_config(overrides, given, saved=saved, labels=labels)


def _run(
    run: str,
    overrides: tuple[str, ...],
    live: str,
    options: dict[str, Any],
    resubmit_: Resubmit | None,
) -> None:
    try:
        config = config_from_run(run, options, overrides)
    except TrolloutError as exc:
        fail(str(exc))
    result: RunResult = run_trio(_collect, config, live_mode(live), resubmit_)
    name = "resubmit" if resubmit_ is not None else "resume"
    report_run(result, title=f"trollout {name}: {result.layout.rollouts.name}")


async def _collect(config: RunConfig, live: bool | None, resubmit_: Resubmit | None) -> RunResult:
    return await collect_any(config, live, resubmit_)  # a Ray run resumes on Ray


@click.command(context_settings=_CONTEXT)
@_session_options
def resume(run: str, overrides: tuple[str, ...], live: str, **options: Any) -> None:
    """Resume RUN with its saved settings, sending what is not done.

    Done means landed, failed terminally, counted as zero, or at the attempt cap; everything
    else (failed, killed, drained, never started) is dispatched with a new attempt number.
    A changed input file, plan setting or agent set is refused (exit 2) unless
    --allow-unsafe-resume.
    """
    _run(run, overrides, live, options, None)


@click.command(context_settings=_CONTEXT)
@_session_options
@click.option(
    "--class",
    "classes",
    multiple=True,
    metavar="CLASS",
    help="Only rollouts whose latest failure has this class. Repeatable.",
)
def resubmit(
    run: str, overrides: tuple[str, ...], live: str, classes: tuple[str, ...], **options: Any
) -> None:
    """Send RUN's rollouts that did not land again, past the cap.

    Without --class, every rollout that has not landed goes out again with a new attempt
    number: terminal failures, failures counted as zero, rollouts at the attempt cap, and what
    resume would send. With --class, only those whose latest failure has one of the classes.
    Landed rollouts never do.
    """
    _run(run, overrides, live, options, Resubmit(classes=frozenset(classes)))
