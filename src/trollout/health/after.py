"""The health step as the other commands call it: settings, a never-failing run, status counts.

``collect`` and ``aggregate`` each call `run_after` with one line; its settings come from
`HealthSettings.from_values` (NeMo Gym's keys ``disable_health_check``, ``health_check_workers``,
``health_check_ignored_checks`` and trollout's options), so the parsing of those keys has one
definition. `run_after` returns the lines to print: the two report lines, or one line saying the
step failed and why - a health step never fails the run it reports on.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import orjson
from attrs import frozen

from ..errors import ConfigError
from ..text import visible
from .run import QUALITY_SUMMARY, ROLLOUT_VERDICTS, HealthReport, check_files, parse_ignored

__all__ = ["KEYS", "HealthSettings", "run_after", "verdict_counts"]

# NeMo Gym's settings of the health step, with their defaults.
KEYS: Final[dict[str, Any]] = {
    "disable_health_check": False,
    "health_check_workers": None,
    "health_check_ignored_checks": [],
}


@frozen
class HealthSettings:
    """Whether and how the post-run health check runs.

    Attributes:
        disabled: skip it (``--no-health-check``, ``+disable_health_check=true``).
        workers: worker processes (None: 1, inline).
        ignored: ignored check ids, sorted and known.
    """

    disabled: bool = False
    workers: int | None = None
    ignored: tuple[str, ...] = ()

    @classmethod
    def of(cls, settings: Any) -> HealthSettings:
        """Build from an object with NeMo Gym's keys as attributes (a `RunConfig`)."""
        return cls.from_values({key: getattr(settings, key, d) for key, d in KEYS.items()})

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> HealthSettings:
        """Build from NeMo Gym's keys (missing ones take NeMo Gym's defaults).

        Raises:
            ConfigError: a wrong type, workers < 1, or an unknown check id, naming the key.
        """
        disabled = values.get("disable_health_check", False)
        if type(disabled) is not bool:
            raise ConfigError(
                f"disable_health_check must be true or false (got {disabled!r}); fix the value"
            )
        workers = values.get("health_check_workers")
        if workers is not None and (type(workers) is not int or workers < 1):
            raise ConfigError(
                f"health_check_workers must be an integer >= 1 (got {workers!r}); fix the value "
                "or drop it"
            )
        raw = values.get("health_check_ignored_checks")
        if raw is not None and not isinstance(raw, str | list | tuple):
            raise ConfigError(
                f"health_check_ignored_checks must be a list of check ids or a comma-separated "
                f"string (got {raw!r})"
            )
        try:
            ignored = parse_ignored(raw)
        except ConfigError as exc:
            raise ConfigError(f"health_check_ignored_checks: {exc}") from None
        return cls(disabled=disabled, workers=workers, ignored=ignored)


def run_after(
    rollouts_files: Sequence[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    settings: HealthSettings,
    observe: Callable[[HealthReport], None] | None = None,
) -> tuple[HealthReport | None, list[str]]:
    """Run the health check after a run; return the report (None: skipped or failed) and lines.

    ``observe`` is called with the report when there is one (the run's telemetry counts it).
    Never raises (but for KeyboardInterrupt and the like): a failure is one line naming it.
    """
    if settings.disabled:
        return None, []
    try:
        files = [f for f in rollouts_files if Path(f).is_file()]
        if not files:
            return None, ["Rollout health: skipped (no rollouts file was written)"]
        report = check_files(
            files, out_dir, ignored_checks=settings.ignored, workers=settings.workers or 1
        )
    except Exception as exc:  # the run is done; its health report must not undo it
        reason = visible(f"{type(exc).__name__}: {exc}")
        return None, [f"Rollout health: not checked ({reason}); trollout health-check reruns it"]
    if observe is not None:
        observe(report)
    return report, report.lines()


def verdict_counts(run_dir: str | os.PathLike[str]) -> dict[str, int] | None:
    """Verdict counts of the health files in ``run_dir``, or None when there are none.

    Reads ``quality_summary.json`` when ``rollout_verdicts.jsonl`` is beside it (a summary alone
    may be another tool's); a damaged summary counts as none.
    """
    folder = Path(run_dir)
    summary, verdicts = folder / QUALITY_SUMMARY, folder / ROLLOUT_VERDICTS
    if not (summary.is_file() and verdicts.is_file()):
        return None
    try:
        counts = orjson.loads(summary.read_bytes())["run"]["verdicts"]
        return {key: int(counts[key]) for key in ("healthy", "unhealthy", "unobserved")}
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None
