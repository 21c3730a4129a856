"""Refuse a run before anything is touched: trollout writes only its own run folder's files.

A run replaces, appends to and truncates the files of its folder (`RunLayout`), so before any of
that (and again under the folder's lock) three checks refuse what would destroy data that is not
ours to destroy, each with one line that names the file and the remedy:

- `check_run_paths`: every run file that exists is a regular file, not a symlink. A link could
  send an append or a truncation to a file outside the folder (``OUT.lock`` planted as a link to
  someone's file); a device, FIFO or directory at ``-o`` is not a file we made and must never be
  replaced (``-o /dev/null`` run as root replaced the device with a regular file).
- `check_input`: the input is not one of the run's files nor a temp file of one, by path and by
  inode (a hard link), so a fresh run can never replace its own input
  (``collect out/r.jsonl -o out/r.jsonl``, or input ``out/r_failures.jsonl``).
- `check_fresh`: a fresh run over a folder that already holds a run (a manifest or outcome rows)
  needs ``overwrite``; without it the message says ``--resume`` or ``--overwrite``.
- `check_relocated_inputs`: materialized inputs kept elsewhere (``materialized_jsonl_fpath``,
  `layout`) are not another of the run's files nor a file of another run (a rollouts file or
  sibling whose manifest lies beside it); a fresh run replaces a file already there only with
  ``overwrite``, since nothing says it is ours; and a resume names the place the run's manifest
  records, or none (it is then read from the manifest).

The store runs them again under the lock (a second process may have changed the folder since)
and opens files with ``O_NOFOLLOW`` besides, which closes the window between check and open.

Rejected alternative: following links and writing wherever they point (what NeMo Gym does). A
run folder is ours to clear on ``--overwrite``; a link's target never is.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import RunFolderError
from ..settings import RunConfig
from .files import check_replaceable, temp_files
from .layout import AUXILIARY_SUFFIXES, RunLayout, recorded_inputs
from .lock import RunLock
from .manifest import FolderState, folder_state

__all__ = [
    "check_fresh",
    "check_input",
    "check_relocated_inputs",
    "check_run_folder",
    "check_run_paths",
    "run_paths",
    "same_file",
]


def check_run_folder(layout: RunLayout, config: RunConfig, *, fresh: bool) -> None:
    """Refuse a run that would destroy what is not ours; read-only (the checks above).

    `open_run_store` runs it (and again under the lock); a driver may call it earlier to fail
    before slow work such as planning a large input.

    Args:
        layout: the run folder.
        config: the run's settings (``input_jsonl_fpath``, ``overwrite``).
        fresh: a new run (False: a resume, which replaces nothing).

    Raises:
        RunFolderLockedError: another collector is using the folder.
        RunFolderError: one line naming the file and the remedy.
    """
    check_run_paths(layout)
    check_relocated_inputs(layout, fresh=fresh, overwrite=config.overwrite)
    check_input(layout, config.input_jsonl_fpath, resuming=not fresh)
    RunLock.for_layout(layout).check_free()  # "in use" says more than "holds a run"
    if fresh:
        check_fresh(layout, overwrite=config.overwrite)


def run_paths(layout: RunLayout) -> tuple[Path, ...]:
    """Return every path a run may write in its folder, the lock included."""
    return (*layout.all_files(), layout.lock)


def check_run_paths(layout: RunLayout) -> None:
    """Refuse a run whose files exist as anything but regular files (links, devices, ...).

    Raises:
        RunFolderError: naming the first such file, what it is, and the remedy.
    """
    for path in run_paths(layout):
        check_replaceable(path, "the run file", "another output file (-o)")


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether two paths name one file: by path (folders resolved, so a missing file compares
    too) or by inode (a hard link, or a link in a folder on the way)."""
    return _resolved(Path(a)) == _resolved(Path(b)) or _same_file(Path(a), Path(b))


def check_input(
    layout: RunLayout, input_path: str | os.PathLike[str] | None, *, resuming: bool = False
) -> None:
    """Refuse an input that is one of the run's files, which a fresh run would replace.

    A resume of a folder that holds a run may name the run's own materialized inputs (a
    shard's manifest does: its rows are its input), since such a resume reads them and never
    replaces them. A folder that holds no run yet (only its inputs, as a kill before the
    manifest or a NeMo Gym shard without a row leaves it) is started afresh even by a resume,
    which would plan the inputs again and replace them, so there they are refused too.

    Raises:
        RunFolderError: naming the input, the run file it is, and the remedy.
    """
    if not input_path:
        return
    source = Path(input_path)
    holds_run = resuming and folder_state(layout) is not FolderState.NEW
    own_inputs = (layout.materialized_inputs,) if holds_run else ()
    for path in (*run_paths(layout), *temp_files(layout)):
        if path in own_inputs:
            continue
        if same_file(source, path):
            raise RunFolderError(
                f"the input {str(source)!r} is the run file {str(path)!r} of output "
                f"{str(layout.output)!r}, which the run would replace; collect into another "
                "output file (-o), or move the input out of the way"
            )


def check_relocated_inputs(layout: RunLayout, *, fresh: bool, overwrite: bool) -> None:
    """Refuse materialized inputs kept where they would clash (the module docstring's rules).

    Raises:
        RunFolderError: naming ``materialized_jsonl_fpath``, the clash and the remedy.
    """
    recorded = recorded_inputs(layout.output) if layout.manifest.exists() else None
    if not fresh and layout.manifest.exists():
        kept = recorded if recorded is not None else RunLayout(layout.output).materialized_inputs
        if not same_file(kept, layout.materialized_inputs):
            raise RunFolderError(
                f"materialized_jsonl_fpath={str(layout.materialized_inputs)!r} is not where "
                f"{str(layout.output)!r} keeps its materialized inputs ({str(kept)!r}); drop "
                "the key to resume from the recorded file"
            )
    if not layout.relocated:
        return
    where = layout.materialized_inputs
    beside = RunLayout(layout.output)  # the run's other files, where they always are
    for path in run_paths(beside):
        if path != beside.materialized_inputs and same_file(where, path):
            raise RunFolderError(
                f"materialized_jsonl_fpath={str(where)!r} is the run file {str(path)!r} of "
                f"output {str(layout.output)!r}; choose another path for the inputs"
            )
    other = RunLayout(where.with_name(_stem_of(where.name) + ".jsonl"))
    if other.output != layout.output and other.manifest.exists():
        raise RunFolderError(
            f"materialized_jsonl_fpath={str(where)!r} is a file of the run "
            f"{str(other.output)!r} (its manifest is {other.manifest.name}); choose another path"
        )
    ours = recorded is not None and same_file(recorded, where)
    if fresh and not overwrite and not ours and _nonempty(where):
        raise RunFolderError(
            f"materialized_jsonl_fpath={str(where)!r} already exists and no run of "
            f"{str(layout.output)!r} records it; pass --overwrite to replace it, or choose "
            "another path"
        )


def _stem_of(name: str) -> str:
    """The stem of the run a ``.jsonl`` file name would belong to (its sibling suffix off)."""
    stem = name.removesuffix(".jsonl")
    for suffix in AUXILIARY_SUFFIXES:
        if stem.endswith(suffix):
            return stem.removesuffix(suffix)
    return stem


def check_fresh(layout: RunLayout, *, overwrite: bool) -> None:
    """Refuse to start afresh over a folder that holds a run, unless ``overwrite``.

    Raises:
        RunFolderError: naming the output, what it holds, and ``--resume`` / ``--overwrite``.
    """
    if overwrite or folder_state(layout) is FolderState.NEW:
        return
    held = [p.name for p in (layout.rollouts, layout.failures, layout.manifest) if _nonempty(p)]
    raise RunFolderError(
        f"{str(layout.output)!r} already holds a run ({', '.join(held)}); pass --resume to "
        "continue it, or --overwrite to delete it and start afresh"
    )


def _resolved(path: Path) -> Path:
    # The folder resolved, the name kept: a missing file resolves like an existing one.
    return Path(os.path.realpath(path.parent)) / path.name


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _nonempty(path: Path) -> bool:
    try:
        return os.lstat(path).st_size > 0
    except OSError:
        return False
