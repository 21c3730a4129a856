"""The file names of a run folder (docs/protocol.md section 7), in one place.

With ``O`` the output path and ``stem`` its name without ``.jsonl``, every file of a run sits
beside ``O``. Nothing else in trollout spells these names; the store, resume, status and
aggregation all ask a `RunLayout`.
"""

from __future__ import annotations

import os
from pathlib import Path

from attrs import frozen

from ..settings.derived import materialized_jsonl_fpath, output_stem

__all__ = ["AUXILIARY_SUFFIXES", "RunLayout", "is_auxiliary"]

# Stems ending in these are siblings, never shards (docs/protocol.md section 8).
AUXILIARY_SUFFIXES = ("_failures", "_materialized_inputs", "_attempts")


@frozen
class RunLayout:
    """The paths of one run folder, derived from the output path."""

    output: Path

    @classmethod
    def for_output(cls, output: str | os.PathLike[str]) -> RunLayout:
        """Return the layout of the run whose rollouts file is ``output``."""
        return cls(Path(output))

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
        return materialized_jsonl_fpath(self.output)

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


def is_auxiliary(path: str | os.PathLike[str]) -> bool:
    """Whether a ``.jsonl`` path is a run's sibling file rather than a rollouts shard."""
    stem = Path(path).name.removesuffix(".jsonl")
    return stem.endswith(AUXILIARY_SUFFIXES)
