"""The runs a ``trollout view`` command line names, and how their files are opened.

A RUN argument is an output file (or any of its run's files), its folder, or a glob of shards
(``'runs/x/rollouts_shards/*/rollouts.jsonl'``, quoted so the shell leaves it alone): each
becomes one `Run` of one or more shards, each shard a `RunLayout`. Files are opened read-only,
never through a symbolic link, and only when they are regular files: a run folder is data, and
the view reads nothing outside the run files of the folders it was given.
"""

from __future__ import annotations

import errno
import glob
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from attrs import frozen

from ..errors import ConfigError, RunFolderError
from ..recovery.layout import RunLayout, is_auxiliary
from ..recovery.manifest import locate_run

__all__ = ["Run", "open_run_file", "resolve_runs", "verdicts_paths"]

_GLOB_CHARS = frozenset("*?[")
VERDICTS_SUFFIX = "_rollout_verdicts.jsonl"  # trollout's name beside the rollouts file
NEMO_VERDICTS = "rollout_verdicts.jsonl"  # NeMo Gym's name in the folder


@frozen
class Run:
    """One run as the view shows it.

    Attributes:
        label: the RUN argument as given.
        shards: its shards' layouts (one for a plain run), in sorted order.
    """

    label: str
    shards: tuple[RunLayout, ...]


def resolve_runs(arguments: Sequence[str]) -> list[Run]:
    """Return the runs the RUN arguments name.

    Raises:
        ConfigError: an argument names nothing, a folder holding no run or several, or a glob
            matching no rollouts file (names the argument and what to do).
    """
    return [_resolve(argument) for argument in arguments]


def _resolve(argument: str) -> Run:
    if _GLOB_CHARS & set(argument):
        matches = sorted(glob.glob(argument))
        shards = []
        for match in matches:
            if os.path.isdir(match):
                shards.append(locate_run(match))
            elif match.endswith(".jsonl") and not is_auxiliary(match):
                shards.append(RunLayout.for_output(match))
        if not shards:
            raise ConfigError(
                f"{argument!r} matches no rollouts file; give a run's output file, its folder, "
                "or a glob of shards' output files"
            )
        return Run(argument, tuple(shards))
    path = Path(argument)
    if not path.exists() and not path.is_symlink():
        raise ConfigError(f"{argument!r} does not exist; give a run's output file or its folder")
    layout = locate_run(path)
    if not any(f.exists() for f in (layout.rollouts, layout.materialized_inputs, layout.manifest)):
        raise ConfigError(
            f"{argument!r} is not a run: {str(layout.rollouts)!r} has neither rollouts, "
            "materialized inputs nor a manifest; give a run's output file or its folder"
        )
    return Run(argument, (layout,))


def verdicts_paths(layout: RunLayout) -> tuple[Path, ...]:
    """The health verdicts files a run may have, in the order looked for."""
    return (
        layout.output.with_name(layout.stem + VERDICTS_SUFFIX),
        layout.output.with_name(NEMO_VERDICTS),
    )


def open_run_file(path: Path) -> BinaryIO | None:
    """Open a run file for reading, or return None when it does not exist.

    Raises:
        RunFolderError: the path is a symbolic link or not a regular file (refused: the view
            reads only the run files of the folders it was given).
    """
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RunFolderError(
                f"{str(path)!r} is a symbolic link; the view reads no run file through a link "
                "(copy the file into the run folder)"
            ) from None
        raise RunFolderError(f"cannot read {str(path)!r}: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RunFolderError(f"{str(path)!r} is not a regular file; the view reads none other")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")
