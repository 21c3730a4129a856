"""The health step of a run: judge the rollouts after the metrics, never failing the run.

`collect` (`compose.collect`) calls it once the run is aggregated, and ``trollout aggregate``
calls it over the merged output (or the shards when nothing is merged), as NeMo Gym's collector
and aggregator do. It lives in the run layer because it joins two layers that do not know each
other: `trollout.health` judges the rollouts, and the HTML report `trollout.metrics` wrote is
written again with the health section. Never raises: a failure is one line.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..health import HealthReport, HealthSettings, run_after
from ..text import visible

if TYPE_CHECKING:
    from ..metrics import AggregateResult

__all__ = ["after_run"]


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
    report (`health.run_after`: the run's telemetry counts verdicts). Never raises: a failure
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
