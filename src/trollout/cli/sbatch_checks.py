"""The checks ``trollout sbatch`` makes before it writes a script: the script's own path, and
a Prometheus port the array's tasks could not share. Apart from the command so that it stays
parsing and printing.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ConfigError
from ..recovery.files import check_replaceable
from ..recovery.preflight import same_file
from ..scaleout.layout import shards_root
from ..settings import RunConfig
from ..telemetry import TelemetrySettings

__all__ = ["check_prometheus", "check_script"]


def check_script(
    script: Path, touched: list[tuple[str, Path]], output: Path, *, overwrite: bool
) -> None:
    """Refuse a --script path the run uses, a link or special file, or an existing file.

    Raises:
        ConfigError: the path is a file the run reads or writes, or exists without
            ``--overwrite-script``.
        RunFolderError: the path is a symlink or not a regular file (`check_replaceable`).
    """
    shown = str(script)
    for what, path in touched:
        if same_file(script, path):
            raise ConfigError(
                f"--script {shown!r} is {what} {str(path)!r}, which the run reads or writes; "
                "writing the script there would destroy it: choose another --script path"
            )
    folder = shards_root(output)
    if same_file(script, folder) or _resolved(script).is_relative_to(_resolved(folder)):
        raise ConfigError(
            f"--script {shown!r} is inside the shards folder {str(folder)!r}, which the jobs "
            "write; choose another --script path"
        )
    exists = check_replaceable(script, "the --script file", "another --script path")
    if exists and not overwrite:
        raise ConfigError(
            f"--script {shown!r} already exists; pass --overwrite-script to replace it, or "
            "choose another --script path"
        )


def check_prometheus(config: RunConfig, watching: TelemetrySettings | None) -> None:
    """Refuse a fixed Prometheus port: array jobs sharing a node cannot all bind it.

    ``watching``: the jobs' telemetry, from the environment they will inherit, as now.
    """
    if watching is None or watching.prometheus is None or watching.prometheus[1] == 0:
        return
    port = watching.prometheus[1]
    asked = (
        f"--metrics-port {port!r}"
        if config.metrics_port is not None
        else f"OTEL_METRICS_EXPORTER=prometheus (port {port!r})"
    )
    raise ConfigError(
        f"{asked}: array jobs may share a node, where only the first could bind the port; "
        "pass --metrics-port 0 (any free port, printed in each job's log), or send metrics "
        "over OTLP (--otlp-endpoint)"
    )


def _resolved(path: Path) -> Path:
    return Path(os.path.realpath(path))
