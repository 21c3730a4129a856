"""The run manifest: what a run folder was made from, and the check resume makes against it.

``<stem>_manifest.json`` is written (atomically, fsynced) after the materialized inputs and
before the first dispatch. It holds the run id, the trollout version, three fingerprints and
the resolved settings:

- ``input_sha256``: sha256 of the input file's bytes;
- ``settings_sha256``: `RunConfig.plan_fingerprint`, the settings that change the
  materialized rows (`config.PLAN_KEYS`); when it differs, the saved settings are compared key
  by key (`config.plan_differences`), so a fingerprint that gained a key, or a setting that
  only orders the rows, does not make an earlier run unresumable;
- ``deployment_sha256``: `Deployment.fingerprint`, the agent set and routes (names, not ports).

Resume recomputes the three and refuses a mismatch with `RunChangedError`, naming each change
(the settings that differ with both values, the agents added or removed) unless
``allow_unsafe_resume``. The saved settings let ``trollout resume RUN`` run again with no other
argument; paths are saved absolute so that works from any folder.

Design note: the manifest is the folder's commit marker: it is written last, so a folder
without one never had a rollout dispatched by trollout, and `folder_state` treats such a folder
as new only when it holds no outcome rows (otherwise it refuses, rather than clear them). The
rejected alternative wrote the manifest first; a crash before the materialized inputs then left
a manifest that promised inputs that do not exist.
"""

from __future__ import annotations

import enum
import hashlib
import os
import secrets
import time
from pathlib import Path
from typing import Any, Protocol

import attrs
import orjson
from attrs import frozen

from .._version import __version__
from ..errors import ConfigError, RunChangedError, RunFolderError
from ..records import RunManifest, converter
from ..settings import RunConfig, plan_differences, saved_as_started
from ..settings import converter as config_converter
from .files import replace_atomically
from .layout import RunLayout

__all__ = [
    "Deployment",
    "FolderState",
    "ManifestCheck",
    "build_manifest",
    "check_manifest",
    "folder_state",
    "locate_run",
    "read_manifest",
    "saved_settings",
    "sha256_file",
    "write_manifest",
]

# Settings that belong to one invocation, not to the run: never saved, never reused.
_PER_INVOCATION = (
    "resume_from_cache",
    "allow_unsafe_resume",
    "resubmit",
    "otlp_endpoint",  # telemetry is how this invocation is watched, not part of the run
    "metrics_port",
    "metrics_host",
    "metrics_linger_s",
    "metrics_pushgateway",
)
_PATH_KEYS = ("input_jsonl_fpath", "output_jsonl_fpath", "materialized_jsonl_fpath")
_HASH_CHUNK = 1 << 20


class FolderState(enum.Enum):
    """What a run folder holds, as far as resuming it is concerned."""

    NEW = "new"  # no manifest and no outcome rows: a run may start here from scratch
    RESUMABLE = "resumable"  # manifest and materialized inputs present
    UNMANIFESTED = "unmanifested"  # outcomes and materialized inputs, no manifest (NeMo Gym)
    BROKEN = "broken"  # outcomes (or a manifest) without materialized inputs: cannot resume


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Return the hex sha256 of a file's bytes (streaming).

    Raises:
        ConfigError: the file cannot be read.
    """
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(_HASH_CHUNK):
                digest.update(chunk)
    except OSError as exc:
        raise ConfigError(
            f"cannot read input file {os.fspath(path)!r}: {exc.strerror}; check the path"
        ) from exc
    return digest.hexdigest()


def saved_settings(config: RunConfig) -> dict[str, Any]:
    """Return the settings a manifest saves: every field, paths absolute, per-run flags out."""
    settings: dict[str, Any] = config_converter.unstructure(config)
    for key in _PER_INVOCATION:
        settings.pop(key, None)
    for key in _PATH_KEYS:
        if settings.get(key):
            settings[key] = os.path.abspath(settings[key])
    return settings


class Deployment(Protocol):
    """What the run folder needs of a deployment: `collector.deployment.Deployment` is one.

    A protocol, not an import: the run folder sits beside the collector and never reaches into
    its stages (docs/architecture.md); the run layer hands it the deployment it discovered.
    """

    def fingerprint(self) -> str:
        """Return sha256 of the agent set and routes (names and types, never hosts or ports)."""

    def agent_set(self) -> dict[str, Any]:
        """Return the names a manifest keeps to explain a changed fingerprint."""

    def policy_model_servers(self) -> dict[str, str]:
        """Return agent or environment server name -> the model server of the agent it runs."""


def build_manifest(
    config: RunConfig,
    deployment: Deployment,
    *,
    input_sha256: str,
    expected: int,
    tasks: int,
    run_id: str | None = None,
) -> RunManifest:
    """Return the manifest of a run about to start (a new run id unless ``run_id``)."""
    return RunManifest(
        run_id=run_id or secrets.token_hex(8),
        trollout_version=__version__,
        created_at=time.time(),
        input_sha256=input_sha256,
        settings_sha256=config.plan_fingerprint(),
        deployment_sha256=deployment.fingerprint(),
        expected_rollouts=expected,
        tasks=tasks,
        settings=saved_settings(config),
        deployment=deployment.agent_set(),
    )


def write_manifest(layout: RunLayout, manifest: RunManifest, *, durable: bool = True) -> None:
    """Write the manifest atomically and (``durable``) fsync it (blocking: call from a worker
    thread)."""
    data = orjson.dumps(converter.unstructure(manifest), option=orjson.OPT_INDENT_2)
    try:
        replace_atomically(layout.manifest, [data, b"\n"], durable=durable)
    except OSError as exc:
        raise RunFolderError(
            f"cannot write the manifest {str(layout.manifest)!r}: {exc.strerror}; check free "
            "space and permissions of the folder, then run again"
        ) from exc


def read_manifest(layout: RunLayout) -> RunManifest | None:
    """Read the run's manifest, or None when there is none.

    Its settings read as the run was started (`settings.saved_as_started`): a manifest written
    before a default changed resumes with the old default.

    Raises:
        RunFolderError: the manifest exists but cannot be read or parsed.
    """
    try:
        data = layout.manifest.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise RunFolderError(
            f"cannot read the manifest {str(layout.manifest)!r}: {exc.strerror}; check its "
            "permissions"
        ) from exc
    try:
        manifest = converter.structure(orjson.loads(data), RunManifest)
    except Exception as exc:  # orjson or cattrs: the file is not a manifest
        raise RunFolderError(
            f"the manifest {str(layout.manifest)!r} is damaged ({type(exc).__name__}); restore "
            "it, or collect into a new folder"
        ) from exc
    # a key the run saved no value for means what it meant when the run started
    return attrs.evolve(manifest, settings=saved_as_started(manifest.settings))


def locate_run(path: str | os.PathLike[str]) -> RunLayout:
    """Return the run a command-line RUN names: its rollouts file, manifest, or folder.

    A folder must hold exactly one run (one ``*_manifest.json``, else one
    ``*_materialized_inputs.jsonl``).

    Raises:
        ConfigError: the folder holds no run or several.
    """
    p = Path(path)
    if not p.is_dir():
        name = p.name
        for suffix in ("_manifest.json", "_materialized_inputs.jsonl", "_failures.jsonl"):
            if name.endswith(suffix):
                return RunLayout.for_output(p.with_name(name[: -len(suffix)] + ".jsonl"))
        return RunLayout.for_output(p)
    for suffix in ("_manifest.json", "_materialized_inputs.jsonl"):
        found = sorted(p.glob(f"*{suffix}"))
        if len(found) == 1:
            return RunLayout.for_output(
                found[0].with_name(found[0].name[: -len(suffix)] + ".jsonl")
            )
        if len(found) > 1:
            names = ", ".join(f.name for f in found)
            raise ConfigError(
                f"folder {str(p)!r} holds several runs ({names}); name one run's output file"
            )
    raise ConfigError(
        f"folder {str(p)!r} holds no run (no *_manifest.json or *_materialized_inputs.jsonl); "
        "name the run's output file"
    )


def folder_state(layout: RunLayout) -> FolderState:
    """Classify a run folder for resume (call under the run's lock)."""
    outcomes = _has_rows(layout.rollouts) or _has_rows(layout.failures)
    inputs = layout.materialized_inputs.exists()
    if layout.manifest.exists():
        return FolderState.RESUMABLE if inputs else FolderState.BROKEN
    if not outcomes:
        return FolderState.NEW
    return FolderState.UNMANIFESTED if inputs else FolderState.BROKEN


def _has_rows(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return any(line.strip() for line in f)
    except FileNotFoundError:
        return False


@frozen
class ManifestCheck:
    """What resume compares with the manifest (None: not checked)."""

    input_sha256: str | None
    settings_sha256: str
    deployment_sha256: str
    settings: dict[str, Any]
    deployment: dict[str, Any]

    @classmethod
    def of(
        cls, config: RunConfig, deployment: Deployment, *, input_sha256: str | None
    ) -> ManifestCheck:
        """Return the check values of the current config and deployment."""
        return cls(
            input_sha256=input_sha256,
            settings_sha256=config.plan_fingerprint(),
            deployment_sha256=deployment.fingerprint(),
            settings=saved_settings(config),
            deployment=deployment.agent_set(),
        )


def check_manifest(
    layout: RunLayout, manifest: RunManifest, current: ManifestCheck, *, allow_unsafe: bool
) -> list[str]:
    """Compare a run's manifest with the current run; return the changes found.

    Raises:
        RunChangedError: something changed and ``allow_unsafe`` is False; the message lists
            every change and the ways forward.
    """
    changes = list(_changes(manifest, current))
    if changes and not allow_unsafe:
        folder = str(layout.output)
        raise RunChangedError(
            f"cannot resume {folder!r}: " + "; ".join(changes) + ". Resuming would mix "
            "rollouts of two different runs; collect into a new output file, undo the change, "
            "or pass --allow-unsafe-resume to resume anyway"
        )
    return changes


def _changes(manifest: RunManifest, current: ManifestCheck) -> list[str]:
    changes = []
    if current.input_sha256 is not None and current.input_sha256 != manifest.input_sha256:
        path = manifest.settings.get("input_jsonl_fpath")
        changes.append(
            f"the input file {path!r} changed since the run began (sha256 "
            f"{manifest.input_sha256[:12]}… now {current.input_sha256[:12]}…)"
        )
    if current.settings_sha256 != manifest.settings_sha256 and _plan_changed(manifest, current):
        changes.append(_settings_change(manifest.settings, current.settings))
    if current.deployment_sha256 != manifest.deployment_sha256:
        changes.append(_deployment_change(manifest.deployment, current.deployment))
    return changes


def _plan_changed(manifest: RunManifest, current: ManifestCheck) -> bool:
    """Whether the plan settings differ, compared key by key (`config.plan_differences`).

    A manifest without saved settings can only be judged by its fingerprint.
    """
    return not manifest.settings or bool(plan_differences(manifest.settings, current.settings))


def _settings_change(saved: dict[str, Any], now: dict[str, Any]) -> str:
    diffs = plan_differences(saved, now)
    if not diffs:
        return "the settings that shape the materialized rows changed (a different version?)"
    return "settings changed: " + ", ".join(diffs)


def _deployment_change(saved: dict[str, Any], now: dict[str, Any]) -> str:
    parts = []
    for what in ("agents", "environment_servers"):
        before, after = set(saved.get(what, ())), set(now.get(what, ()))
        label = what.replace("_", " ")
        if after - before:
            parts.append(f"{label} added: {', '.join(sorted(after - before))}")
        if before - after:
            parts.append(f"{label} removed: {', '.join(sorted(before - after))}")
    detail = "; ".join(parts) if parts else "same names, different routes"
    return f"the deployment's agent set changed ({detail})"
