"""What a run was, from its manifest: the metadata the HTML report and ``trollout view`` show.

One definition of "the settings that differ from the defaults": a run's saved settings
compared with those a run given nothing but defaults would save (`recovery.manifest`'s
`saved_settings` of a default `RunConfig`), the input and output paths left out (they are shown
on their own). The manifest is read as JSON, tolerantly: a report or a page shows what it can
of a damaged or older manifest rather than failing.
"""

from __future__ import annotations

import functools
from typing import Any, Final

from ..recovery.manifest import saved_settings
from ..settings import RunConfig

__all__ = ["default_settings", "run_info", "settings_changed"]

_SHOWN_ELSEWHERE: Final = frozenset({"input_jsonl_fpath", "output_jsonl_fpath"})
_KEYS: Final = (
    "run_id",
    "trollout_version",
    "created_at",
    "input_sha256",
    "expected_rollouts",
    "tasks",
    "deployment",
)


@functools.cache
def default_settings() -> dict[str, Any]:
    """The settings a manifest would save for a run given nothing but defaults."""
    return saved_settings(RunConfig())


def settings_changed(settings: Any) -> dict[str, Any]:
    """The saved settings that differ from the defaults (the input and output paths left out)."""
    if not isinstance(settings, dict):
        return {}
    defaults = default_settings()
    return {
        key: value
        for key, value in sorted(settings.items())
        if key not in _SHOWN_ELSEWHERE and (key not in defaults or defaults[key] != value)
    }


def run_info(manifest: Any) -> dict[str, Any] | None:
    """The run metadata of a manifest's JSON: identity, input, deployment, changed settings."""
    if not isinstance(manifest, dict):
        return None
    settings = manifest.get("settings")
    settings = settings if isinstance(settings, dict) else {}
    return {
        **{key: manifest.get(key) for key in _KEYS},
        "input": settings.get("input_jsonl_fpath"),
        "settings_changed": settings_changed(settings),
    }
