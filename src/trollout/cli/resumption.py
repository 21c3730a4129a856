"""Resuming a run folder: check it against its manifest, decide, seed the store.

What `collect_run` does before dispatching into a folder that already holds a run (``--resume``,
``trollout resume``, ``trollout resubmit``). The order matters: the folder is locked first (by
the store), then checked under the lock, so two resumes cannot both decide. A folder that cannot
be checked is refused and left exactly as it was; it is never cleared.
"""

from __future__ import annotations

from typing import IO

import trio

from ..collector.deployment import Deployment
from ..config import RunConfig
from ..errors import RunFolderError
from ..recovery.layout import RunLayout
from ..recovery.manifest import (
    FolderState,
    ManifestCheck,
    build_manifest,
    check_manifest,
    folder_state,
    read_manifest,
    sha256_file,
    write_manifest,
)
from ..recovery.resume import Resubmit, ResumePlan, ResumeRules, scan_run
from ..recovery.store import RunStore

__all__ = ["prepare_resume"]


async def prepare_resume(
    store: RunStore,
    config: RunConfig,
    deployment: Deployment,
    resubmit: Resubmit | None,
    stream: IO[str],
) -> ResumePlan:
    """Check the folder against the manifest, decide what to dispatch, seed the store.

    Raises:
        RunFolderError: the folder's materialized inputs are missing, or it holds outcomes but
            no manifest (unless ``allow_unsafe_resume``), or its files disagree.
        RunChangedError: the input, plan settings or agent set changed since the run began.

    Cancellation: a checkpoint; nothing is written before the decision, so a retry is safe.
    """
    layout = store.layout
    state = folder_state(layout)
    if state is FolderState.BROKEN:
        raise RunFolderError(_broken_message(layout))
    manifest = read_manifest(layout)
    digest = await _input_digest(config, stream)
    if manifest is None:
        _check_adoptable(layout, config)
    else:
        current = ManifestCheck.of(config, deployment, input_sha256=digest)
        for change in check_manifest(
            layout, manifest, current, allow_unsafe=config.allow_unsafe_resume
        ):
            print(
                f"trollout: warning: resuming anyway (--allow-unsafe-resume): {change}", file=stream
            )
    rules = ResumeRules(
        max_attempts=config.max_attempts,
        retry_terminal_timeouts=config.retry_terminal_timeouts,
        longest_first=config.dispatch_longest_first,
        resubmit=resubmit,
    )
    resumed = await trio.to_thread.run_sync(scan_run, layout, rules)
    tally = resumed.tally
    if manifest is not None and tally.expected != manifest.expected_rollouts:
        raise RunFolderError(
            f"the materialized inputs {str(layout.materialized_inputs)!r} hold {tally.expected} "
            f"rollouts but the manifest says {manifest.expected_rollouts}; the file was changed "
            "after the run began; restore it, or collect into a new output file"
        )
    store.seed(expected=tally.expected, landed=resumed.landed, statuses=resumed.take_statuses())
    if manifest is None:  # adopting a folder trollout did not start: record what it is now
        new = build_manifest(
            config, deployment, input_sha256=digest or "", expected=tally.expected, tasks=0
        )
        await trio.to_thread.run_sync(write_manifest, layout, new)
    return resumed


async def _input_digest(config: RunConfig, stream: IO[str]) -> str | None:
    path = config.input_jsonl_fpath
    if path and await trio.Path(path).exists():
        return await trio.to_thread.run_sync(sha256_file, path)
    print(
        f"trollout: warning: input file {path!r} is gone; resuming from the materialized "
        "inputs without checking it",
        file=stream,
    )
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
