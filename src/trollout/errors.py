"""The exceptions trollout raises, one tree under `TrolloutError`.

A failed rollout is data (`records.Failed`), never an exception. Only run-level conditions raise::

    TrolloutError
    ├── ConfigError(ValueError)          a bad option, config key or override; exit 2
    │   └── InputError                   bad input rows (file, line, key), all reported together
    ├── DeploymentError                  the deployment cannot serve this run; exit 2
    │   └── UnknownAgentError(KeyError)  rows route to agents the deployment does not have
    ├── RunFolderError(OSError)          the run folder cannot be used (locked, changed, unreadable)
    │   ├── RunFolderLockedError         another collector owns the folder
    │   ├── RunChangedError              resume found a changed input, plan or agent set
    │   └── RunFolderWriteError ─┐       the folder could not be written mid-run (disk full)
    ├── CaptureFileError(OSError)        a model-call capture file refused (enrichment: a gap)
    ├── RunStoppedError(RuntimeError)    a run-level stop no retry can fix (exit 1)
    │   └── RunFolderWriteError ─┘       (both: a folder problem that stopped a run; exit 1)
    ├── IncompleteEvaluationError        require_complete and work left (exit 75 or 76)
    ├── RolloutRequestError              the NeMo Gym drop-in's failed ``/run`` (failures not
    │                                    routed to the sidecar: NeMo Gym raises there too)
    └── UnsupportedOptionError(NotImplementedError)  a NeMo Gym option trollout does not do yet

Every message names the thing, shows the bad value with ``!r``, says what was expected and ends
with the remedy. `InputError` and `UnknownAgentError` carry every problem found, so a user fixes
the whole input in one go.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "ArgumentTypeError",
    "CaptureFileError",
    "ConfigError",
    "DeploymentError",
    "IncompleteEvaluationError",
    "InputError",
    "RolloutRequestError",
    "RunChangedError",
    "RunFolderError",
    "RunFolderLockedError",
    "RunFolderWriteError",
    "RunStoppedError",
    "TrolloutError",
    "UnknownAgentError",
    "UnsupportedOptionError",
]


class TrolloutError(Exception):
    """Base class of every error trollout raises on purpose."""


class ConfigError(TrolloutError, ValueError):
    """A setting is missing, malformed or out of range."""


class ArgumentTypeError(ConfigError, TypeError):
    """A Python API was given an argument of the wrong type; the message names the parameter,
    the type given and what to pass (a `TypeError` too, as Python's own would be)."""


class InputError(ConfigError):
    """One or more input rows cannot be dispatched.

    Attributes:
        problems: one line per problem, each naming file and line or key.
    """

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        head = self.problems[0] if self.problems else "invalid input"
        more = len(self.problems) - 1
        suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more > 0 else ""
        super().__init__(head + suffix)


class DeploymentError(TrolloutError):
    """The deployment cannot be found, parsed or does not serve this run."""


class UnknownAgentError(DeploymentError, KeyError):
    """Rows route to agents the deployment does not serve."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)

    def __str__(self) -> str:
        # KeyError.__str__ would quote the message; we want it as written.
        return self.message


class RunFolderError(TrolloutError, OSError):
    """The run folder cannot be used as asked."""


class RunFolderLockedError(RunFolderError):
    """Another collector holds the run folder's lock."""


class RunChangedError(RunFolderError):
    """Resume refused: the run's input, plan settings or agent set changed since it began."""


class CaptureFileError(TrolloutError, OSError):
    """A model-call capture file cannot be read safely (a symlink, too big, not a regular file,
    another file's hard link, unreadable); the message names the file and why. Enrichment turns
    it into the rollout's gap marker (``model_call_capture_unreadable``), never a failed
    rollout."""


class RunStoppedError(TrolloutError, RuntimeError):
    """A run-level condition stopped the run; its files are kept."""


class RunFolderWriteError(RunStoppedError, RunFolderError):
    """Writing the run folder failed mid-run (disk full, quota, I/O error).

    The run stops: nothing more is written (no torn row is left behind), rollouts in flight are
    cancelled, and the folder stays resumable once the cause is fixed.
    """


class IncompleteEvaluationError(TrolloutError, RuntimeError):
    """Under ``require_complete``, the run left rollouts that did not land.

    Attributes:
        unfinished: rollouts that did not land.
        expected: rollouts the run was asked for.
        retryable: whether a resume would dispatch anything (exit 75), or all that is left is
            terminal or at the attempt cap (exit 76).
    """

    def __init__(self, *, unfinished: int, expected: int, retryable: bool) -> None:
        self.unfinished = unfinished
        self.expected = expected
        self.retryable = retryable
        remedy = (
            "resume the run to retry them"
            if retryable
            else "none can be retried (terminal or at the attempt cap); use trollout resubmit "
            "to force them, or score without require_complete"
        )
        super().__init__(
            f"require_complete: {unfinished} of {expected} rollouts did not land, so no score "
            f"was written; {remedy}"
        )


class RolloutRequestError(TrolloutError):
    """A rollout's ``/run`` failed, raised where NeMo Gym's ``run_examples`` raises it.

    Only `trollout.nemo_gym` raises it, for a failure not routed to the sidecar
    (``route_failures_to_sidecar=False``, NeMo Gym's default); everywhere else a failed
    rollout is data (`records.Failed`).

    Attributes:
        row: the row as dispatched.
        failure_row: the typed failure row (``_ng_failure_class``, ``failure_kind``, ...), as
            the failures sidecar would hold it.
    """

    def __init__(self, row: dict[str, object], failure_row: dict[str, object]) -> None:
        self.row = row
        self.failure_row = failure_row
        where = f"task {row.get('_ng_task_index')!r} rollout {row.get('_ng_rollout_index')!r}"
        status = failure_row.get("_ng_failure_http_status")
        http = f" (HTTP {status})" if status is not None else ""
        super().__init__(
            f"/run of {where} failed{http}: {failure_row.get('_ng_failure_class')!s} "
            f"({failure_row.get('failure_kind')!s}): {failure_row.get('_ng_failure_message')!s}; "
            "pass route_failures_to_sidecar=True to receive failures as rows instead"
        )


class UnsupportedOptionError(TrolloutError, NotImplementedError):
    """A NeMo Gym option that trollout does not implement yet; the message names the option,
    why, and what to do instead. Raised before anything is dispatched."""
