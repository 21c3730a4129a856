"""A run's saved settings read against today's: what a key they lack means, and what changed.

A manifest saves every setting of its run (`recovery.manifest.saved_settings`). A run saved
before a setting existed, or before its default changed, lacks the key or holds the old
default; `saved_as_started` reads such a set as the run was started (`fields.Row.absent`), and
`plan_differences` compares two sets key by key, which decides whether a run may be resumed.
Apart from `record` so the rows stay one table and these rules are read alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

from .fields import row_of
from .record import DEFAULTS, ORDER_KEYS, PLAN_KEYS, RunConfig, converter

__all__ = ["plan_differences", "saved_as_started"]

# What a saved set of settings means by a key it lacks, where that is not today's default: the
# default the key had before it changed (`fields.Row.absent`), unstructured as a manifest holds it.
_ABSENT: Final = {
    a.name: converter.unstructure(row_of(a).absent)
    for a in attrs.fields(RunConfig)
    if row_of(a).absent is not None
}
# Plan settings that change nothing unless seeds are added (``num_repeats_add_seed``).
_SEED_KEYS: Final = frozenset({"seed", "seed_mode"})


def saved_as_started(saved: Mapping[str, Any]) -> dict[str, Any]:
    """Return a run's saved settings with each key they lack that has an `_ABSENT` meaning.

    A manifest written before a setting's default changed lacks the key, or holds the old
    default; either way the run resumes with what it was started with, never today's default.
    """
    return {**_ABSENT, **saved}


def plan_differences(saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """Return ``key saved -> now`` for each plan setting that differs between two saved sets.

    Both are `saved_settings`-shaped mappings (a manifest's, and the current run's); a key one
    of them lacks (a setting added later) counts as what it meant then (`saved_as_started`,
    else its default), and `ORDER_KEYS` are not compared, nor the seed settings when neither
    set adds seeds. This, not the fingerprint's bytes, decides whether a run may be resumed, so
    a fingerprint that gains a key, or a default that changes, never strands the runs made
    before.
    """
    saved, now = saved_as_started(saved), saved_as_started(now)
    seeded = _adds_seeds(saved) or _adds_seeds(now)
    diffs = []
    for key in PLAN_KEYS:
        if key in ORDER_KEYS or (key in _SEED_KEYS and not seeded):
            continue
        default = converter.unstructure(DEFAULTS[key])
        before, after = saved.get(key, default), now.get(key, default)
        if before != after:
            diffs.append(f"{key} {before!r} -> {after!r}")
    return diffs


def _adds_seeds(settings: Mapping[str, Any]) -> bool:
    value = settings.get("num_repeats_add_seed", False)
    return any(value.values()) if isinstance(value, Mapping) else bool(value)
