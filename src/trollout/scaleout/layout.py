"""Where the shards of a distributed run live: ``<stem>_shards/<I>-of-<N>/<stem>.jsonl``.

With ``O`` the run's output (``runs/eval.jsonl``), shard I of N is a whole run folder at
``runs/eval_shards/00003-of-00008/eval.jsonl``: the shard's files keep the run's names, and the
count in the folder name means shards of two different splits never share a folder. The merged
run is written at ``O`` by ``trollout aggregate`` (or by the Ray driver at the end).

Every shard folder is opened by the store like any run folder, so the rules of
`recovery.preflight` hold for each (never through a link, never over a special file, a folder
holding a run replaced only on ``--overwrite``). The shards folder itself is checked here: a
symlink or a file where it should be is refused, since everything below it would be written
through it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Final

from attrs import frozen

from ..recovery.files import check_replaceable
from ..recovery.layout import RunLayout

__all__ = ["ShardFolder", "check_shards_root", "shard_folders", "shard_output", "shards_root"]

_NAME: Final = re.compile(r"([0-9]{5,})-of-([0-9]{5,})")


@frozen
class ShardFolder:
    """One shard's run folder: shard ``index`` of ``count``, its rollouts file ``output``."""

    index: int
    count: int
    output: Path

    @property
    def layout(self) -> RunLayout:
        """The shard's run folder."""
        return RunLayout.for_output(self.output)


def shards_root(output: str | os.PathLike[str]) -> Path:
    """Return the folder holding the shards of the run whose output is ``output``."""
    layout = RunLayout.for_output(output)
    return layout.output.with_name(layout.stem + "_shards")


def shard_output(output: str | os.PathLike[str], index: int, count: int) -> Path:
    """Return the rollouts file of shard ``index`` of ``count`` of the run at ``output``."""
    name = f"{index:05d}-of-{count:05d}"
    return shards_root(output) / name / Path(output).name


def shard_folders(output: str | os.PathLike[str], count: int | None = None) -> list[ShardFolder]:
    """Return the shard folders of the run at ``output`` (of ``count`` shards, or any count).

    Only folders named ``<I>-of-<N>`` (not links) are shards; nothing is created.
    """
    found = []
    try:
        entries = sorted(os.scandir(shards_root(output)), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return []
    name = Path(output).name
    for entry in entries:
        match = _NAME.fullmatch(entry.name)
        if match is None or not entry.is_dir(follow_symlinks=False):
            continue
        index, n = int(match[1]), int(match[2])
        if (count is None or n == count) and index < n:
            found.append(ShardFolder(index, n, Path(entry.path) / name))
    return found


def check_shards_root(output: str | os.PathLike[str]) -> None:
    """Refuse a shards folder that is a symlink or not a directory (read-only).

    Raises:
        RunFolderError: naming the path, what it is, and the remedy (`check_replaceable`).
    """
    check_replaceable(
        shards_root(output), "the shards folder", "another output file (-o)", folder=True
    )
