"""The file names of a run folder (docs/protocol.md section 7), in one place.

With ``O`` the output path and ``stem`` its name without ``.jsonl``, every file of a run sits
beside ``O``, but for the materialized inputs when the run was given ``materialized_jsonl_fpath``
elsewhere (NeMo Gym's key; `settings.derived`). Nothing else in trollout spells these names; the
store, resume, status and aggregation all ask a `RunLayout`.

Where the inputs are is recorded in the run's manifest (its saved ``materialized_jsonl_fpath``,
absolute), and `RunLayout.for_output` reads it there when not told: so every reader that knows a
run by its output path (``trollout resume``/``status``/``aggregate``/``view``, the auditor) finds
inputs kept elsewhere with no option of its own. A folder without a manifest has its inputs
beside the output (the manifest is written right after a relocated file, and a run without one is
started afresh). Rejected: a link or a copy beside the output (a link is what the run-folder
checks refuse, `preflight`; a copy is two files to keep equal), and an option on every reader
(each would have to be given the path again, and a reader given none would call the run broken).
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson
from attrs import frozen

from ..settings.derived import materialized_jsonl_fpath, output_stem

__all__ = ["AUXILIARY_SUFFIXES", "RunLayout", "is_auxiliary", "recorded_inputs"]

# Stems ending in these are siblings, never shards (docs/protocol.md section 8).
AUXILIARY_SUFFIXES = ("_failures", "_materialized_inputs", "_attempts")


@frozen
class RunLayout:
    """The paths of one run folder, derived from the output path.

    Attributes:
        output: the rollouts file.
        inputs: the materialized inputs when they are not beside the output (None: they are).
    """

    output: Path
    inputs: Path | None = None

    @classmethod
    def for_output(
        cls,
        output: str | os.PathLike[str],
        materialized: str | os.PathLike[str] | None = None,
    ) -> RunLayout:
        """Return the layout of the run whose rollouts file is ``output``.

        ``materialized``: where its materialized inputs are (None: where its manifest records
        them, else beside the output).
        """
        out = Path(output)
        where = Path(materialized) if materialized else recorded_inputs(out)
        if where is not None and os.path.abspath(where) == os.path.abspath(
            materialized_jsonl_fpath(out)
        ):
            where = None
        return cls(out, where)

    @property
    def stem(self) -> str:
        """The output file's name without ``.jsonl``."""
        return output_stem(self.output)

    def _sibling(self, suffix: str) -> Path:
        return self.output.with_name(self.stem + suffix)

    @property
    def rollouts(self) -> Path:
        """Successes only, one row per landed rollout."""
        return self.output

    @property
    def failures(self) -> Path:
        """The failures sidecar: one row per failed attempt."""
        return self._sibling("_failures.jsonl")

    @property
    def materialized_inputs(self) -> Path:
        """Every materialized row, written before the first dispatch (`settings.derived`)."""
        return self.inputs if self.inputs is not None else materialized_jsonl_fpath(self.output)

    @property
    def relocated(self) -> bool:
        """Whether the materialized inputs are kept elsewhere than beside the output."""
        return self.inputs is not None

    @property
    def aggregate_metrics(self) -> Path:
        """Server and local metrics, NeMo Gym's list shape."""
        return self._sibling("_aggregate_metrics.json")

    @property
    def batch_status(self) -> Path:
        """Saved progress, replaced atomically."""
        return self._sibling("_batch_status.json")

    @property
    def manifest(self) -> Path:
        """Run identity and fingerprints, written before the first dispatch."""
        return self._sibling("_manifest.json")

    @property
    def attempts(self) -> Path:
        """The attempt ledger: reserved attempts, one batch per write."""
        return self._sibling("_attempts.jsonl")

    @property
    def lock(self) -> Path:
        """The single-writer lock file."""
        return self._sibling(".lock")

    @property
    def report(self) -> Path:
        """The self-contained HTML report."""
        return self._sibling("_report.html")

    def all_files(self) -> tuple[Path, ...]:
        """Every file a run may write (a fresh run clears these), the lock excepted."""
        return (
            self.rollouts,
            self.failures,
            self.materialized_inputs,
            self.aggregate_metrics,
            self.batch_status,
            self.manifest,
            self.attempts,
            self.report,
        )


def recorded_inputs(output: str | os.PathLike[str]) -> Path | None:
    """Return where the manifest of the run at ``output`` records its materialized inputs, when
    elsewhere than beside the output; None otherwise (no manifest, or not readable: the readers
    that need the manifest report that themselves).

    The manifest's format is `manifest.py`'s; only this key is read here, because the layout
    comes before the manifest (which names its files through it).
    """
    out = Path(output)
    try:
        data = orjson.loads(out.with_name(output_stem(out) + "_manifest.json").read_bytes())
        where = data["settings"]["materialized_jsonl_fpath"]
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError):
        return None
    return Path(where) if isinstance(where, str) and where else None


def is_auxiliary(path: str | os.PathLike[str]) -> bool:
    """Whether a ``.jsonl`` path is a run's sibling file rather than a rollouts shard."""
    stem = Path(path).name.removesuffix(".jsonl")
    return stem.endswith(AUXILIARY_SUFFIXES)
