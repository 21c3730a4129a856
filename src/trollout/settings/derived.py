"""Settings NeMo Gym derives from others: the materialized inputs' path, from the output's.

A run's materialized inputs are ``<stem>_materialized_inputs.jsonl`` beside
``output_jsonl_fpath`` (`materialized_jsonl_fpath` here), as NeMo Gym derives them, unless the
run is given ``materialized_jsonl_fpath`` (a `RunConfig` setting, NeMo Gym's key): the inputs
are then written there, the manifest records the place (absolute), and everything that reads
the run finds them through it (`recovery.layout`). The run folder, which names every other file
of a run from the same stem, asks this module for the default: one rule, here, because it is a
setting's rule and the settings package may import nothing of the run folder's.

Design note: NeMo Gym 0.7.0 lists ``materialized_jsonl_fpath`` among its collection settings,
but derives it from the output, so a launch script that passes another path gets its inputs
beside the output anyway. trollout used to refuse any other path (a silent ignore being the
worse choice); it now writes where it is told, which is what such a script asks for, and keeps
the run whole: the run-folder checks apply to the file (`recovery.preflight`: no link, not
another file of this or another run, not replaced without ``overwrite`` unless the run records
it), a resume reads it from the manifest, and a run split into parts (``shard``, Ray) refuses
the key, since one file cannot hold every part's inputs. Rejected: accepting the key and
ignoring it as NeMo Gym does (a setting taken in silence), and refusing it (NeMo Gym's launch
scripts that set it would not run).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Final

__all__ = [
    "MATERIALIZED_INPUTS_SUFFIX",
    "SPLIT_KEYS",
    "materialized_jsonl_fpath",
    "materialized_problem",
    "output_stem",
]

MATERIALIZED_INPUTS_SUFFIX: Final = "_materialized_inputs.jsonl"
# Settings that split a run into parts, each with an output (and materialized inputs) of its own.
SPLIT_KEYS: Final = ("shard", "ray_address", "ray_workers", "ray_blocks")


def output_stem(output: str | os.PathLike[str]) -> str:
    """Return the output file's name without ``.jsonl`` (every file of a run starts with it)."""
    name = Path(output).name
    return name[: -len(".jsonl")] if name.endswith(".jsonl") else name


def materialized_jsonl_fpath(output: str | os.PathLike[str]) -> Path:
    """Return where the run whose rollouts file is ``output`` writes its materialized inputs."""
    return Path(output).with_name(output_stem(output) + MATERIALIZED_INPUTS_SUFFIX)


def materialized_problem(path: str | None, config: Any) -> str | None:
    """Return why ``materialized_jsonl_fpath`` cannot be ``path`` for a run whose settings
    (``config``, a `RunConfig`) split it into parts (`SPLIT_KEYS`), or None: one file cannot
    hold every part's inputs."""
    by = next((key for key in SPLIT_KEYS if getattr(config, key) is not None), None)
    if not path or by is None:
        return None
    return (
        f"materialized_jsonl_fpath={path!r} names one file, but {by} splits the run into parts "
        "that each write their own inputs beside their output; drop materialized_jsonl_fpath"
    )
