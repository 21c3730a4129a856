"""Opening a run folder for one run: fresh or resumed, its manifest checked.

`open_run_folder` is the one way a run folder is opened, by ``trollout collect`` / ``resume`` /
``resubmit`` and by drivers (a trainer's shards, `run.shards`) alike. Under the folder's
lock (`store.open_run_store`) it either

- **starts a new run**: writes the materialized inputs (atomically; only then is an old run
  replaced, and only with ``overwrite``), then the manifest (`manifest`), both fsynced (but
  under ``--fsync never``), before anything can be dispatched; or
- **resumes** (``resume_from_cache`` or a resubmit) a folder that holds a run: the manifest's
  fingerprints are checked against the input, the plan settings and the agent set, then
  `resume.scan_run` decides what to send with which attempt numbers, and the store is seeded
  with what the folder holds. A folder that cannot be checked is refused and left exactly as it
  was; it is never cleared. A resumed folder that holds no run starts afresh.

The yielded `RunFolder` names what to dispatch (`RunFolder.rows`): a fresh run's rows are read
back from its materialized-inputs file, so a fresh run and a resume dispatch from one source.

A run given its rows in memory (`MaterializedRows`: a trainer's batch) has no input file: its
manifest names the materialized-inputs file as the input, so ``trollout resume`` of the folder
checks and dispatches exactly those rows (NeMo Gym resumes a shard the same way, with
``+input_jsonl_fpath=<shard>_materialized_inputs.jsonl``).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, Protocol

import attrs
import trio
from attrs import define, frozen

from .. import jsonl
from ..errors import ConfigError, InputError, RunFolderError
from ..paths import regular_file
from ..records import MaterializedRow, RunManifest
from ..settings import RunConfig
from .layout import RunLayout
from .manifest import (
    Deployment,
    FolderState,
    ManifestCheck,
    build_manifest,
    check_manifest,
    folder_state,
    read_manifest,
    sha256_file,
    write_manifest,
)
from .resume import Resubmit, ResumePlan, ResumeRules, RunTally, scan_run
from .store import RunStore, open_run_store

__all__ = ["MaterializedRows", "RowSource", "RunFolder", "input_sha256", "open_run_folder"]

Warn = Callable[[str], None]
_INPUT_REMEDY = "pass the JSONL file the run was planned from"


class RowSource(Protocol):
    """The rows of a new run: a `collector.plan.Plan`, or `MaterializedRows`.

    A source may also have ``bodies()``, the same rows' bodies (a `Plan` has): the
    materialized-inputs file is then written from those, and no identity is built for it.
    """

    @property
    def tasks(self) -> int:
        """Distinct tasks."""
        ...

    @property
    def expected(self) -> int:
        """Rollouts."""
        ...

    def rows(self) -> Iterator[MaterializedRow]:
        """Every materialized row, in dispatch order (a fresh pass each call)."""
        ...


@frozen
class MaterializedRows:
    """Rows already materialized in memory (a driver's batch), as a `RowSource`."""

    items: Sequence[MaterializedRow]

    @property
    def tasks(self) -> int:
        """Distinct task indices among the rows."""
        return len({row.identity.task_index for row in self.items})

    @property
    def expected(self) -> int:
        """One rollout per row."""
        return len(self.items)

    def rows(self) -> Iterator[MaterializedRow]:
        """The rows, in order."""
        return iter(self.items)


@define
class RunFolder:
    """An open run folder, ready to dispatch into.

    Attributes:
        layout: the folder's file names.
        store: the folder's `RunStore`: the sink (and attempt reserver) of the run.
        manifest: the run's manifest (written now for a new run, read for a resume).
        expected: rollouts of the whole run.
        to_dispatch: rollouts `rows` yields.
        resumed: what the folder held before (None for a new run).
    """

    layout: RunLayout
    store: RunStore
    manifest: RunManifest
    expected: int
    to_dispatch: int
    resumed: RunTally | None = None
    _rows: Callable[[], Iterable[tuple[MaterializedRow, int]]] = attrs.field(
        alias="rows", default=lambda: ()
    )

    def rows(self) -> Iterable[tuple[MaterializedRow, int]]:
        """Return what to dispatch: ``(row, attempt number)`` pairs (reads the folder)."""
        return self._rows()


@asynccontextmanager
async def open_run_folder(
    config: RunConfig,
    deployment: Deployment,
    *,
    plan: RowSource | Callable[[], RowSource] | None = None,
    resubmit: Resubmit | None = None,
    warn: Warn | None = None,
    run_id: str | None = None,
) -> AsyncIterator[RunFolder]:
    """Open ``config.output_jsonl_fpath``'s folder for a run: start it, or resume it.

    Args:
        config: the run's settings; ``resume_from_cache`` resumes, ``overwrite`` lets a new
            run replace an old one, ``input_jsonl_fpath`` is fingerprinted (None: the rows
            are the input, see the module docstring).
        deployment: the deployment (its agent set goes into the manifest and is checked).
        plan: the new run's rows, or a function returning them (called only when a new run
            starts, under the lock); unused by a resume.
        resubmit: resume and also send rollouts done without landing (``trollout resubmit``).
        warn: where a resume's warnings go (default: stderr).
        run_id: the new run's id (default: a fresh one).

    Raises:
        ConfigError: no output path, or a new run without rows.
        RunFolderLockedError: another collector owns the folder.
        RunFolderError: the folder cannot be used (`store.check_run_folder`), or resumed.
        RunChangedError: resuming a run whose input, plan settings or agent set changed.

    Cancellation: a checkpoint while opening; a cancelled open leaves the folder as it was
    (`RunStore.write_materialized_inputs` replaces nothing until its inputs are complete).
    Exit is the store's: shielded, every accepted row flushed, the lock released last.
    """
    if not config.output_jsonl_fpath:
        raise ConfigError("no output file: pass -o OUT.jsonl or +output_jsonl_fpath=<file.jsonl>")
    layout = RunLayout.for_output(config.output_jsonl_fpath, config.materialized_jsonl_fpath)
    resuming = config.resume_from_cache or resubmit is not None
    expected = plan.expected if plan is not None and not callable(plan) else 0
    servers = deployment.policy_model_servers()  # rows are read stamped with them
    async with open_run_store(layout, config, expected=expected, fresh=not resuming) as store:
        if resuming and folder_state(layout) is not FolderState.NEW:
            resumed = await _resume(store, config, deployment, resubmit, warn or _stderr)
            yield _resumed_folder(store, *resumed, servers)
        else:
            source = plan() if callable(plan) else plan
            if source is None:
                raise ConfigError(
                    f"{str(layout.output)!r} holds no run to resume; a new run needs its rows "
                    "(pass plan=)"
                )
            manifest = await _start(store, config, deployment, source, run_id)
            yield RunFolder(
                layout,
                store,
                manifest,
                source.expected,
                source.expected,
                rows=lambda: ((row, 0) for row in _materialized(layout, servers)),
            )


def _stderr(text: str) -> None:
    print(f"trollout: warning: {text}", file=sys.stderr)


def _materialized(layout: RunLayout, servers: Mapping[str, str]) -> Iterator[MaterializedRow]:
    """Read a fresh run's rows back, stamped with their model servers (`Identity.from_row`)."""
    path = layout.materialized_inputs
    for number, line in jsonl.iter_lines(path):
        # The line is kept: it is the first attempt's request as it is (MaterializedRow.raw).
        yield MaterializedRow.from_body(jsonl.parse_line(path, number, line), line, servers)


async def _start(
    store: RunStore,
    config: RunConfig,
    deployment: Deployment,
    source: RowSource,
    run_id: str | None,
) -> RunManifest:
    """Write the materialized inputs, then the manifest (both fsynced, but under ``never``) of
    a new run, in one worker-thread job (`RunStore.write_materialized_inputs`'s ``then``).

    The input is hashed before its rows are materialized, and its size and modification time
    must be the same once they all are: the manifest's hash is of the input the rows came from.
    """
    path = config.input_jsonl_fpath
    stamp = _stamp(path) if path is not None else None
    digest: str | None = None
    # Read-only, so a Ctrl-C may abandon it at once.
    if path is not None:
        digest = await trio.to_thread.run_sync(sha256_file, path, abandon_on_cancel=True)
    else:  # the rows are the input: the manifest names their file
        config = attrs.evolve(config, input_jsonl_fpath=str(store.layout.materialized_inputs))
    expected, tasks = source.expected, source.tasks
    written: list[RunManifest] = []

    def manifest_after_inputs(inputs_sha256: str) -> None:
        # In the inputs' worker thread, once they are in place: the manifest is written after
        # them, as before, without a thread hop of its own. Rows that are the input are hashed
        # as written, not read back.
        manifest = build_manifest(
            config,
            deployment,
            input_sha256=digest if digest is not None else inputs_sha256,
            expected=expected,
            tasks=tasks,
            run_id=run_id,
        )
        write_manifest(store.layout, manifest, durable=store.durable)
        written.append(manifest)

    await store.write_materialized_inputs(
        _checked_rows(source, path, stamp), then=manifest_after_inputs
    )
    return written[0]


def _stamp(path: str) -> tuple[int, int] | None:
    st = regular_file(path, "the input", _INPUT_REMEDY)
    return None if st is None else (st.st_size, st.st_mtime_ns)


def _checked_rows(
    source: RowSource, path: str | None, stamp: tuple[int, int] | None
) -> Iterator[MaterializedRow | Mapping[str, Any]]:
    """Yield ``source``'s rows (or their bodies, when it has ``bodies()``) to write; at their
    end, refuse a count or an input that changed.

    Raised before the last row is committed, so a refused run writes no inputs and no manifest.
    """
    bodies = getattr(source, "bodies", None)
    count = 0
    for row in bodies() if callable(bodies) else source.rows():
        count += 1
        yield row
    if count != source.expected:
        raise InputError(
            [
                f"the rows to materialize numbered {count} but the plan has {source.expected} "
                "rollouts; the input changed while it was read; plan the run again"
            ]
        )
    if path is not None and _stamp(path) != stamp:
        raise InputError(
            [f"{path}: the input file changed while the run was being started; plan the run again"]
        )


async def _resume(
    store: RunStore,
    config: RunConfig,
    deployment: Deployment,
    resubmit: Resubmit | None,
    warn: Warn,
) -> tuple[RunManifest, ResumePlan]:
    """Check the folder against its manifest, seed the store; return the manifest and the plan.

    Raises:
        RunFolderError: the folder's materialized inputs are missing, or it holds outcomes but
            no manifest (unless ``allow_unsafe_resume``), or its files disagree.
        RunChangedError: the input, plan settings or agent set changed since the run began.
    """
    layout = store.layout
    if folder_state(layout) is FolderState.BROKEN:
        raise RunFolderError(_broken_message(layout))
    manifest = read_manifest(layout)
    digest = await _input_digest(config, warn)
    if manifest is None:
        _check_adoptable(layout, config)
    else:
        current = ManifestCheck.of(config, deployment, input_sha256=digest)
        for change in check_manifest(
            layout, manifest, current, allow_unsafe=config.allow_unsafe_resume
        ):
            warn(f"resuming anyway (--allow-unsafe-resume): {change}")
    resumed = await trio.to_thread.run_sync(scan_run, layout, _rules(config, resubmit))
    tally = resumed.tally
    if manifest is not None and tally.expected != manifest.expected_rollouts:
        raise RunFolderError(
            f"the materialized inputs {str(layout.materialized_inputs)!r} hold {tally.expected} "
            f"rollouts but the manifest says {manifest.expected_rollouts}; the file was changed "
            "after the run began; restore it, or collect into a new output file"
        )
    store.seed(expected=tally.expected, landed=resumed.landed, statuses=resumed.take_statuses())
    if manifest is None:  # adopting a folder trollout did not start: record what it is now
        manifest = build_manifest(
            config, deployment, input_sha256=digest or "", expected=tally.expected, tasks=0
        )
        await trio.to_thread.run_sync(
            functools.partial(write_manifest, layout, manifest, durable=store.durable)
        )
    return manifest, resumed


def _resumed_folder(
    store: RunStore, manifest: RunManifest, resumed: ResumePlan, servers: Mapping[str, str]
) -> RunFolder:
    tally = resumed.tally
    return RunFolder(
        store.layout,
        store,
        manifest,
        tally.expected,
        tally.to_dispatch,
        resumed=tally,
        rows=partial(resumed.rows, servers),
    )


def _rules(config: RunConfig, resubmit: Resubmit | None) -> ResumeRules:
    return ResumeRules(
        max_attempts=config.max_attempts,
        retry_terminal_timeouts=config.retry_terminal_timeouts,
        longest_first=config.dispatch_longest_first,
        resubmit=resubmit,
        retry_failed=config.retry_failed_on_resume,
    )


async def input_sha256(path: str) -> str:
    """Return the SHA-256 of a run's input file, as its manifest records it.

    Raises:
        InputError: the input is not a regular file (one line naming it and the remedy).

    Cancellation: abandons the read at once (a worker thread that only reads).
    """
    # Checked before it is opened: opening a FIFO blocks, a device never ends.
    regular_file(path, "the input", _INPUT_REMEDY)
    return await trio.to_thread.run_sync(sha256_file, path, abandon_on_cancel=True)


async def _input_digest(config: RunConfig, warn: Warn) -> str | None:
    path = config.input_jsonl_fpath
    if path and await trio.Path(path).exists():
        return await input_sha256(path)
    warn(f"input file {path!r} is gone; resuming from the materialized inputs without checking it")
    return None


def _check_adoptable(layout: RunLayout, config: RunConfig) -> None:
    if not config.allow_unsafe_resume:
        raise RunFolderError(
            f"cannot resume {str(layout.output)!r}: it holds outcomes but no manifest "
            f"({layout.manifest.name}), so nothing proves it was made from this input, these "
            "settings and this deployment; its outcomes are kept. Collect into a new output "
            "file, or pass --allow-unsafe-resume to adopt it as it is"
        )


def _broken_message(layout: RunLayout) -> str:
    return (
        f"cannot resume {str(layout.output)!r}: its materialized inputs "
        f"({layout.materialized_inputs.name}) are missing, so what remains to do cannot be "
        "known; its outcomes are kept, not cleared. Restore the file, or collect into a new "
        "output file"
    )
