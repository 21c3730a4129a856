# Stays whole: one audit, each rule beside the others it cross-checks.
"""An exactly-once auditor for run folders and shards, for tests (users' property tests too).

``assert_exactly_once(path)`` reads a run (its rollouts file) or a folder of shards and raises
`AssertionError` naming every breach; `audit_run` / `audit_folder` return the `AuditReport`
instead. With the fake's request log (``requests=``: `FakeStats.runs`, or the objects ``GET
/_fake/requests`` serves) it also checks what the deployment received::

    async with open_fake_deployment(spec) as fake:
        ...                                  # collect, cut, resume
    assert_exactly_once(tmp_path / "shards", requests=fake.stats.runs)

What "settled once" means here, per run folder (docs/run-folder.md has the files):

- the materialized inputs hold each rollout (task, rollout) once, and as many as the manifest
  and the saved status expect;
- every record (rollouts file, failures sidecar) names a materialized rollout and the run's id;
- no rollout landed twice, no attempt was written twice (a never-started, drained row aside:
  nothing ran), and nothing was written for an attempt after the one that landed;
- every attempt written was reserved on the attempt ledger first, and every rollout the ledger
  shows accepted (a reservation not released) has an outcome: landed, a sidecar row, or, for
  an interruption not recorded, its entry in the saved status;
- the saved status agrees: ``completed`` is the rollouts landed, and once closed its counts sum
  to ``expected``;
- with the request log: the deployment received each attempt of this run at most once, plus
  once per re-send the ledger records (a 429 or 503 retried within the attempt), received
  every attempt that landed, and nothing outside the materialized rollouts.

Design note: the auditor reads the files itself, with orjson, and imports nothing of trollout
but its errors: an auditor built on the store's own reading code would share its bugs. The
file layout it reads is the documented one (``<stem>_materialized_inputs.jsonl``, or where the
manifest's ``materialized_jsonl_fpath`` says, ``_failures.jsonl``, ``_attempts.jsonl``,
``_manifest.json``, ``_batch_status.json``).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson
from attrs import frozen

from ..errors import ConfigError

__all__ = ["AuditReport", "assert_exactly_once", "audit_folder", "audit_run"]

_AUXILIARY = ("_failures", "_materialized_inputs", "_attempts")
_RUN_MARKERS = ("_materialized_inputs.jsonl", "_manifest.json")  # one beside a run's output
_Key = tuple[int, int]
_Attempt = tuple[int, int, int]


@frozen
class AuditReport:
    """What the auditor found in one run folder (a shard or a command-line run).

    Attributes:
        output: the run's rollouts file.
        run_id: the manifest's run id (None without a manifest).
        expected: rollouts the manifest expects.
        materialized: rollouts in the materialized inputs.
        landed: rollouts landed (each once, when `ok`).
        failed: rollouts whose latest sidecar row is a failure.
        unfinished: rollouts with no outcome in the files (interrupted unrecorded, drained,
            never sent); the saved status accounts for them.
        requests: requests of this run checked in the deployment's log (0 without a log).
        problems: every breach, one line each (empty: settled exactly once).
    """

    output: Path
    run_id: str | None
    expected: int
    materialized: int
    landed: int
    failed: int
    unfinished: int
    requests: int
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """Whether every accepted rollout settled exactly once and every count agrees."""
        return not self.problems


def audit_run(
    output: str | os.PathLike[str], *, requests: Iterable[Any] | None = None
) -> AuditReport:
    """Audit the run whose rollouts file is ``output`` (a shard's ``rollouts-<label>.jsonl``).

    Args:
        output: the rollouts file.
        requests: the fake's request log (`RunSeen` entries or their ``to_json`` mappings);
            entries of other runs (another ``run_id``) are ignored.

    Raises:
        ConfigError: ``output`` has no materialized inputs beside it (not a run folder).
    """
    return _Audit(Path(output), requests).report()


def audit_folder(
    folder: str | os.PathLike[str], *, requests: Iterable[Any] | None = None
) -> list[AuditReport]:
    """Audit every run (shard) in ``folder``, in name order.

    Raises:
        ConfigError: the folder holds no run.
    """
    log = list(requests) if requests is not None else None
    outputs = [
        path
        for path in sorted(Path(folder).glob("*.jsonl"))
        if not path.stem.endswith(_AUXILIARY)
        and any(path.with_name(path.stem + end).exists() for end in _RUN_MARKERS)
    ]
    if not outputs:
        raise ConfigError(f"{os.fspath(folder)!r} holds no run folder (no rollouts file beside")
    return [audit_run(path, requests=log) for path in outputs]


def assert_exactly_once(
    path: str | os.PathLike[str], *, requests: Iterable[Any] | None = None
) -> list[AuditReport]:
    """Audit a run (its rollouts file) or a folder of runs; raise if anything is off.

    Returns:
        the reports, every one `AuditReport.ok`.

    Raises:
        AssertionError: naming every problem of every run.
    """
    where = Path(path)
    reports = (
        audit_folder(where, requests=requests)
        if where.is_dir()
        else [audit_run(where, requests=requests)]
    )
    problems = [f"{r.output.name}: {p}" for r in reports for p in r.problems]
    if problems:
        raise AssertionError("not exactly once:\n  " + "\n  ".join(problems))
    return reports


class _Audit:
    def __init__(self, output: Path, requests: Iterable[Any] | None) -> None:
        self.output = output
        self.stem = output.name.removesuffix(".jsonl")
        self.requests = requests
        self.problems: list[str] = []

    def _sibling(self, suffix: str) -> Path:
        return self.output.with_name(self.stem + suffix)

    def report(self) -> AuditReport:
        manifest = _read_json(self._sibling("_manifest.json"))
        materialized_path = _recorded_inputs(manifest) or self._sibling(
            "_materialized_inputs.jsonl"
        )
        if not materialized_path.exists():
            raise ConfigError(
                f"{os.fspath(self.output)!r} is not a run folder's rollouts file: its "
                f"materialized inputs {materialized_path.name} are missing; pass a run's output "
                "path"
            )
        run_id = manifest.get("run_id") if manifest else None
        inputs = self._materialized(materialized_path)
        expected = int(manifest.get("expected_rollouts", len(inputs))) if manifest else len(inputs)
        if manifest is None:
            self.problems.append("no manifest beside the rollouts file")
        elif expected != len(inputs):
            self.problems.append(
                f"the manifest expects {expected} rollouts; the materialized inputs hold "
                f"{len(inputs)}"
            )
        landed = self._landed(inputs, run_id)
        latest_failure = self._sidecar(inputs, run_id, landed)
        reserved, released, resent = self._ledger()
        self._check_written_attempts(reserved)
        status = _read_json(self._sibling("_batch_status.json"))
        self._check_accepted(reserved, released, landed, latest_failure, status)
        self._check_status(status, expected, landed)
        checked = self._check_requests(run_id, set(inputs), landed, resent)
        failed = sum(1 for key, row in latest_failure.items() if key not in landed and row)
        settled = set(landed) | {k for k, row in latest_failure.items() if row}
        return AuditReport(
            output=self.output,
            run_id=run_id,
            expected=expected,
            materialized=len(inputs),
            landed=len(landed),
            failed=failed,
            unfinished=len(set(inputs) - settled),
            requests=checked,
            problems=tuple(self.problems),
        )

    # --- the files ----------------------------------------------------------------------------

    def _materialized(self, path: Path) -> set[_Key]:
        keys = [_key(row) for row in _read_jsonl(path)]
        for key, count in Counter(keys).items():
            if count > 1:
                self.problems.append(f"task {key[0]} rollout {key[1]} is materialized {count}x")
        return set(keys)

    def _records(self, path: Path, inputs: set[_Key], run_id: str | None) -> list[dict[str, Any]]:
        rows = list(_read_jsonl(path))
        for row in rows:
            key = _key(row)
            if key not in inputs:
                self.problems.append(
                    f"{path.name} has task {key[0]} rollout {key[1]}, not a materialized rollout"
                )
            stamp = row.get("_ng_run_id")
            if run_id is not None and stamp is not None and stamp != run_id:
                self.problems.append(
                    f"{path.name}: task {key[0]} rollout {key[1]} names run {stamp!r}, not "
                    f"the manifest's {run_id!r}"
                )
        return rows

    def _landed(self, inputs: set[_Key], run_id: str | None) -> dict[_Key, int]:
        self._written: Counter[_Attempt] = Counter()
        landed: dict[_Key, int] = {}
        times: Counter[_Key] = Counter()
        for row in self._records(self.output, inputs, run_id):
            key, attempt = _key(row), _attempt(row)
            times[key] += 1
            landed[key] = attempt
            self._written[(*key, attempt)] += 1
        for key, count in times.items():
            if count > 1:
                self.problems.append(f"task {key[0]} rollout {key[1]} landed {count} times")
        return landed

    def _sidecar(
        self, inputs: set[_Key], run_id: str | None, landed: dict[_Key, int]
    ) -> dict[_Key, dict[str, Any] | None]:
        """Each rollout's latest sidecar row (None: its latest is a never-started drain)."""
        latest: dict[_Key, dict[str, Any] | None] = {}
        for row in self._records(self._sibling("_failures.jsonl"), inputs, run_id):
            key, attempt = _key(row), _attempt(row)
            if _drained(row):
                latest.setdefault(key, None)
                continue
            self._written[(*key, attempt)] += 1
            latest[key] = row
            if key in landed and attempt > landed[key]:
                self.problems.append(
                    f"task {key[0]} rollout {key[1]}: attempt {attempt} was written after "
                    f"attempt {landed[key]} landed"
                )
        for (task, rollout, attempt), count in self._written.items():
            if count > 1:
                self.problems.append(
                    f"task {task} rollout {rollout} attempt {attempt} was written {count} times"
                )
        return latest

    def _ledger(self) -> tuple[set[_Attempt], set[_Attempt], Counter[_Attempt]]:
        reserved: set[_Attempt] = set()
        released: set[_Attempt] = set()
        resent: Counter[_Attempt] = Counter()
        self._has_ledger = self._sibling("_attempts.jsonl").exists()
        for line in _read_jsonl(self._sibling("_attempts.jsonl"), torn_tail_ok=True):
            if "resent" in line:
                for task, rollout, attempt, _ in line["resent"]:
                    resent[(task, rollout, attempt)] += 1
            for task, rollout, attempt in line.get("attempts", ()):
                reserved.add((task, rollout, attempt))
            for task, rollout, attempt in line.get("released", ()):
                released.add((task, rollout, attempt))
        return reserved, released, resent

    # --- the checks ---------------------------------------------------------------------------

    def _check_written_attempts(self, reserved: set[_Attempt]) -> None:
        if not self._has_ledger:
            return
        for attempt in sorted(set(self._written) - reserved):
            self.problems.append(
                f"task {attempt[0]} rollout {attempt[1]} attempt {attempt[2]} was written but "
                "never reserved on the attempt ledger"
            )

    def _check_accepted(
        self,
        reserved: set[_Attempt],
        released: set[_Attempt],
        landed: dict[_Key, int],
        latest_failure: dict[_Key, dict[str, Any] | None],
        status: dict[str, Any] | None,
    ) -> None:
        in_status = {
            (r.get("task_index"), r.get("rollout_index"))
            for r in (status or {}).get("rollouts", ())
        }
        accepted = {(t, r) for t, r, a in reserved - released}
        for key in sorted(accepted):
            if key in landed or latest_failure.get(key) or key in in_status:
                continue
            self.problems.append(
                f"task {key[0]} rollout {key[1]} was accepted (an attempt reserved) but has no "
                "outcome: not landed, not in the sidecar, not in the saved status"
            )

    def _check_status(
        self, status: dict[str, Any] | None, expected: int, landed: dict[_Key, int]
    ) -> None:
        if status is None:
            self.problems.append("no saved status (_batch_status.json) beside the rollouts file")
            return
        if status.get("expected") != expected:
            self.problems.append(
                f"the saved status expects {status.get('expected')} rollouts; the manifest "
                f"{expected}"
            )
        if status.get("completed") != len(landed):
            self.problems.append(
                f"the saved status counts {status.get('completed')} completed; the rollouts "
                f"file holds {len(landed)}"
            )
        if status.get("closed"):
            parts = ("completed", "failed", "no_persist", "omitted", "not_started")
            total = sum(int(status.get(part) or 0) for part in parts)
            if total != expected:
                self.problems.append(
                    f"the closed status's counts sum to {total}, not the {expected} expected"
                )

    def _check_requests(
        self,
        run_id: str | None,
        inputs: set[_Key],
        landed: dict[_Key, int],
        resent: Counter[_Attempt],
    ) -> int:
        if self.requests is None or run_id is None:
            return 0
        received: Counter[_Attempt] = Counter()
        for entry in self.requests:
            seen = entry if isinstance(entry, Mapping) else entry.to_json()
            if seen.get("run_id") != run_id:
                continue
            received[(seen["task_index"], seen["rollout_index"], seen["attempt_index"])] += 1
        for (task, rollout, attempt), count in sorted(received.items()):
            if (task, rollout) not in inputs:
                self.problems.append(
                    f"the deployment received task {task} rollout {rollout}, not a "
                    "materialized rollout of this run"
                )
            allowed = 1 + resent[(task, rollout, attempt)]
            if count > allowed:
                self.problems.append(
                    f"the deployment received task {task} rollout {rollout} attempt {attempt} "
                    f"{count} times ({allowed - 1} re-send(s) on the ledger)"
                )
        for (task, rollout), attempt in sorted(landed.items()):
            if received[(task, rollout, attempt)] == 0:
                self.problems.append(
                    f"task {task} rollout {rollout} attempt {attempt} landed but the deployment "
                    "never received it under this run id"
                )
        return sum(received.values())


def _key(row: Mapping[str, Any]) -> _Key:
    return (int(row["_ng_task_index"]), int(row["_ng_rollout_index"]))


def _attempt(row: Mapping[str, Any]) -> int:
    return int(row.get("_ng_attempt_index") or 0)


def _drained(row: Mapping[str, Any]) -> bool:
    return bool(row.get("_ng_dispatch_drained")) or row.get("failure_kind") == "drained"


def _recorded_inputs(manifest: Mapping[str, Any] | None) -> Path | None:
    """Where a manifest records the run's materialized inputs (``materialized_jsonl_fpath``,
    given when they are not beside the output), or None."""
    settings = manifest.get("settings") if manifest else None
    where = settings.get("materialized_jsonl_fpath") if isinstance(settings, dict) else None
    return Path(where) if isinstance(where, str) and where else None


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    value = orjson.loads(path.read_bytes())
    return value if isinstance(value, dict) else None


def _read_jsonl(path: Path, *, torn_tail_ok: bool = False) -> Iterable[dict[str, Any]]:
    if not path.exists():
        return []
    data = path.read_bytes()
    lines = data.split(b"\n")
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            if torn_tail_ok and number == len(lines):
                continue  # a torn last line: never followed by its send
            raise ConfigError(
                f"{os.fspath(path)}:{number}: not JSON; the run folder is damaged"
            ) from None
    return rows
