"""Shards on disk: finding them, reading them safely, and writing the merged run folder.

- `resolve_inputs`: globs or comma-separated globs, sorted and de-duplicated (by resolved path);
  only ``.jsonl`` files that are not a run's sibling (``_failures``, ``_materialized_inputs``,
  ``_attempts``: `is_auxiliary`) are shards.
- `identical_files`: a file given twice under two names (a copy, a hard or symbolic link) is read
  once. Files are compared by inode, then by sha256 among files of equal size only, so distinct
  shards (which differ in size) are never hashed.
- `read_lines`: aggregation never changes its inputs, so a torn last line (a line without its
  newline that does not parse, left by a collector killed or still writing) is skipped and
  reported instead of repaired in place; a bad line anywhere else is an `InputError`.
- `MergeWriter`: the merged files are written beside their final names and renamed into place
  only when everything succeeded, so an interrupted aggregation leaves no half-written file.
- `refresh_shard_status`: after an aggregation, each shard's ``<stem>_batch_status.json`` says
  how the aggregation that merged it went (``aggregation_status`` ``ok`` or ``error``, the
  metrics file, the errors), its counts kept (NeMo Gym's ``_refresh_shard_status_aggregation``:
  a reader that sums the shards' status files needs no status file of the merged output).
"""

from __future__ import annotations

import glob
import os
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import orjson

from ..errors import ConfigError
from ..jsonl import read_appended
from ..recovery.files import replace_atomically
from ..recovery.layout import RunLayout, is_auxiliary
from ..recovery.manifest import sha256_file

__all__ = [
    "MergeWriter",
    "identical_files",
    "read_lines",
    "refresh_shard_status",
    "refuse_overwrite",
    "resolve_inputs",
]

_GLOB_CHARS = frozenset("*?[")
_BLANK_START = (b"\n", b"\r", b" ", b"\t", b"")


def resolve_inputs(patterns: str | Sequence[str]) -> list[Path]:
    """Expand globs (or comma-separated globs) into the sorted, de-duplicated shard list.

    Raises:
        ConfigError: a literal path does not exist, or nothing matches at all.
    """
    pieces = [patterns] if isinstance(patterns, str) else list(patterns)
    found: dict[str, Path] = {}
    for piece in (p.strip() for text in pieces for p in text.split(",")):
        if not piece:
            continue
        for path in _expand(piece):
            if path.suffix == ".jsonl" and not is_auxiliary(path) and path.is_file():
                found.setdefault(os.path.realpath(path), path)
    if not found:
        raise ConfigError(
            f"no rollouts file matches {patterns!r}; give a glob such as 'shards/*.jsonl' "
            "(sidecars and materialized inputs are never shards)"
        )
    return sorted(found.values(), key=str)


def _expand(piece: str) -> list[Path]:
    if _GLOB_CHARS.isdisjoint(piece):
        if not os.path.exists(piece):
            raise ConfigError(f"input {piece!r} does not exist; check the path or quote the glob")
        return [Path(piece)]
    return [Path(p) for p in glob.glob(os.path.expanduser(piece), recursive=True)]


def identical_files(paths: Sequence[Path]) -> dict[Path, Path]:
    """Map each path whose content repeats an earlier path's to that earlier path.

    Empty files are never reported as copies of one another.
    """
    same: dict[Path, Path] = {}
    by_size: defaultdict[int, list[Path]] = defaultdict(list)
    inodes: dict[tuple[int, int], Path] = {}
    for path in paths:
        st = path.stat()
        first = inodes.setdefault((st.st_dev, st.st_ino), path)
        if first is not path:
            same[path] = first
        elif st.st_size:  # empty files hold nothing to count twice
            by_size[st.st_size].append(path)
    for group in by_size.values():
        if len(group) > 1:
            same.update(_same_content(group))
    return same


def _same_content(paths: Sequence[Path]) -> dict[Path, Path]:
    seen: dict[str, Path] = {}
    same: dict[Path, Path] = {}
    for path in paths:
        digest = sha256_file(path)
        first = seen.setdefault(digest, path)
        if first is not path:
            same[path] = first
    return same


def read_lines(path: Path, torn: list[str]) -> Iterator[tuple[int, bytes, dict[str, Any]]]:
    """Yield ``(line number, raw line, row)`` of a shard; a torn last line goes to ``torn``.

    Raises:
        InputError: a line other than a torn last line is not a JSON object.
    """
    return read_appended(path, torn=torn)


def refuse_overwrite(outputs: Iterable[Path], inputs: Iterable[Path]) -> None:
    """Refuse to write any output that is one of the input files.

    Raises:
        ConfigError: naming the output and the remedy.
    """
    real_inputs = {os.path.realpath(p) for p in inputs}
    for out in outputs:
        if os.path.realpath(out) in real_inputs:
            raise ConfigError(
                f"output {str(out)!r} is one of the input files; aggregation never overwrites "
                "an input: write the merged rollouts elsewhere (-o merged/merged.jsonl)"
            )


class MergeWriter:
    """Writes a merged run folder: rollouts, failures and materialized inputs, atomically."""

    def __init__(self, layout: RunLayout) -> None:
        self.layout = layout
        self._targets = (layout.rollouts, layout.failures, layout.materialized_inputs)
        self._files: list[IO[bytes]] = []

    def __enter__(self) -> MergeWriter:
        self.layout.output.parent.mkdir(parents=True, exist_ok=True)
        self._files = [open(self._temp(p), "wb") for p in self._targets]  # noqa: SIM115
        return self

    def __exit__(self, *exc_info: object) -> None:
        for f in self._files:
            f.close()
        if exc_info[0] is not None:
            self.discard()

    def _temp(self, path: Path) -> Path:
        return path.with_name(f".{path.name}.{os.getpid()}.tmp")

    @property
    def rollouts(self) -> IO[bytes]:
        """The merged rollouts file being written."""
        return self._files[0]

    @property
    def failures(self) -> IO[bytes]:
        """The merged failures sidecar being written."""
        return self._files[1]

    @property
    def materialized(self) -> IO[bytes]:
        """The merged materialized inputs being written."""
        return self._files[2]

    def commit(self) -> None:
        """Move the written files into place (an empty sidecar is not created)."""
        for path in self._targets:
            temp = self._temp(path)
            if path is not self.layout.rollouts and temp.stat().st_size == 0:
                temp.unlink()
                path.unlink(missing_ok=True)
                continue
            os.replace(temp, path)

    def discard(self) -> None:
        """Remove the temporary files."""
        for path in self._targets:
            self._temp(path).unlink(missing_ok=True)


def refresh_shard_status(shards: Iterable[Path], metrics: Path, errors: Sequence[str]) -> None:
    """Record in each shard's status file how the aggregation that merged it went.

    A shard without a status file, or with one that is not a JSON object, is left alone.
    """
    aggregation = {
        "aggregation_status": "error" if errors else "ok",
        "aggregate_metrics_fpath": str(metrics),
        "aggregation_errors": list(errors),
        "aggregated_at": time.time(),
    }
    for shard in shards:
        path = RunLayout.for_output(shard).batch_status
        try:
            status = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            continue
        if isinstance(status, dict):
            status.update(aggregation)
            data = orjson.dumps(status, option=orjson.OPT_INDENT_2)
            replace_atomically(path, [data, b"\n"])
