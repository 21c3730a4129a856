"""The health check's switches of collect and aggregate (apart, so `common` can attach them).

`common` adds them to collect's run options and `health` implements the check: this module
imports neither, so the two do not import each other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

__all__ = ["HEALTH_OPTIONS", "health_options"]

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
