"""Settings NeMo Gym derives from others: the materialized inputs' path, from the output's.

NeMo Gym's ``materialized_jsonl_fpath`` is not chosen: it is ``<stem>_materialized_inputs.jsonl``
beside ``output_jsonl_fpath``. The loader refuses any other value, and the run folder
(`recovery.layout.RunLayout`, which names every other file of a run from the same stem) writes
the materialized inputs exactly there, by asking this module: one rule, here, because it is a
setting's rule and the settings package may import nothing of the run folder's.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

__all__ = ["MATERIALIZED_INPUTS_SUFFIX", "materialized_jsonl_fpath", "output_stem"]

MATERIALIZED_INPUTS_SUFFIX: Final = "_materialized_inputs.jsonl"


def output_stem(output: str | os.PathLike[str]) -> str:
    """Return the output file's name without ``.jsonl`` (every file of a run starts with it)."""
    name = Path(output).name
    return name[: -len(".jsonl")] if name.endswith(".jsonl") else name


def materialized_jsonl_fpath(output: str | os.PathLike[str]) -> Path:
    """Return where the run whose rollouts file is ``output`` writes its materialized inputs."""
    return Path(output).with_name(output_stem(output) + MATERIALIZED_INPUTS_SUFFIX)
