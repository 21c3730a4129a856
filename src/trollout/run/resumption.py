"""`resume` and `resubmit`: continue a run with the settings saved in its manifest.

RUN is the run's output file (or its manifest, or a folder holding one run). The saved
settings are read back (`saved_settings`), the settings given now are laid over them (say a new
``head_server`` after the deployment moved), and the run is collected again with
``resume_from_cache`` (`collect.collect`). A setting that changes the materialized rows
(``num_repeats``) is refused like any other change, unless ``allow_unsafe_resume``.

- `resume` dispatches what docs/protocol.md section 8 says is not done: missing rollouts and
  retryable failures under the attempt cap, each with a new attempt number.
- `resubmit` also dispatches rollouts that are done without having landed: terminal
  failures, failures counted as zero and rollouts at the attempt cap, once more each, past
  the cap; ``classes`` limits it to rollouts whose latest failure is of one of them. A landed
  rollout is never dispatched again.

The command line builds its config through its own loader (option spellings in messages,
notes on stderr) from the same `saved_settings`, and may send a Ray run to Ray; this module is
the library's way, with the same sources in the same order (`nemo_keys.load_run_config`).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from typing import Any

from ..errors import ConfigError
from ..recovery.layout import RunLayout
from ..recovery.manifest import locate_run, read_manifest
from ..recovery.resume import Resubmit
from ..settings import FIELD_NAMES, RunConfig, load_run_config
from .compose import RunResult, collect
from .observe import RunObserver, StreamObserver

__all__ = ["resubmit", "resume", "resume_config", "saved_settings"]


def saved_settings(run: str | os.PathLike[str]) -> tuple[RunLayout, dict[str, Any]]:
    """Return RUN's folder and the settings its manifest saved (`RunConfig` fields only).

    Raises:
        ConfigError: RUN holds no run or several, or has no manifest (its settings are unknown).
    """
    layout = locate_run(run)
    manifest = read_manifest(layout)
    if manifest is None:
        raise ConfigError(
            f"run {str(layout.output)!r} has no manifest ({layout.manifest.name}), so its "
            "settings are unknown; resume it with trollout collect INPUT -o "
            f"{layout.output!s} --resume --allow-unsafe-resume"
        )
    return layout, {k: v for k, v in manifest.settings.items() if k in FIELD_NAMES}


def resume_config(
    run: str | os.PathLike[str],
    settings: Mapping[str, Any] | None = None,
    *,
    observer: RunObserver | None = None,
) -> RunConfig:
    """Return the config that resumes RUN: its saved settings < ``settings`` (NeMo Gym keys).

    Notes (a setting replaced under another key, one trollout handles its own way) go to
    ``observer``.

    Raises:
        ConfigError: RUN has no manifest, or a bad or doubly given setting.
    """
    layout, saved = saved_settings(run)
    given = {**(settings or {}), "output_jsonl_fpath": str(layout.output)}
    given["resume_from_cache"] = True
    config, notes = load_run_config(options=given, saved=saved)
    for note in notes:
        (observer or StreamObserver()).message(f"trollout: note: {note}")
    return config


async def resume(
    run: str | os.PathLike[str],
    *,
    settings: Mapping[str, Any] | None = None,
    observer: RunObserver | None = None,
    **options: Any,
) -> RunResult:
    """Resume RUN with its saved settings (module docstring); ``options`` are `collect`'s.

    Raises:
        ConfigError: as `resume_config`; and whatever `collect` raises.

    Cancellation: as `collect`'s.
    """
    config = resume_config(run, settings, observer=observer)
    return await collect(config, observer=observer, **options)


async def resubmit(
    run: str | os.PathLike[str],
    *,
    classes: Collection[str] = (),
    settings: Mapping[str, Any] | None = None,
    observer: RunObserver | None = None,
    **options: Any,
) -> RunResult:
    """Send RUN's rollouts that did not land again, past the cap (module docstring).

    Raises:
        ConfigError: as `resume_config`; and whatever `collect` raises.

    Cancellation: as `collect`'s.
    """
    config = resume_config(run, settings, observer=observer)
    chosen = Resubmit(classes=frozenset(classes))
    return await collect(config, observer=observer, resubmit=chosen, **options)
