"""One Slurm for the test session, and Slurm scenarios that run beside the rest of the suite.

Why: a Slurm scenario mostly waits on Slurm's own clocks (a task requeued by Slurm is eligible
again only two minutes later, a fixed delay; a 3-minute ``--time`` signals a minute in), so run
in series it would add three idle minutes to ``make test``. `start_in_background` runs such a
scenario in a thread from the moment collection ends (tests/scaleout/conftest.py), while the
other tests run; its test only checks the result (`Background.result`), so the wait overlaps
the suite instead of adding to it. Only scenarios whose test is selected are started.

A scenario runs the trollout command line as subprocesses (click's in-process runner swaps
``sys.stdout`` for the whole process, which a thread must not do) and returns what its test
asserts on; it must bound every wait itself. The cluster (`cluster`) is started once, by the
first caller, and stopped by `finish` at the end of the session, by pid (`slurm_cluster`).

Rejected: a test that runs first and sleeps (the wait is still in series); pytest-xdist (every
test of the suite would then need to be safe to run in parallel processes, for one scenario).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slurm_cluster import SlurmCluster, SlurmUnavailableError, start_slurm

_lock = threading.Lock()
_state: dict[str, Any] = {"cluster": None, "error": None, "folder": None}
_started: dict[str, Background] = {}


def scratch() -> Path:
    """The session's own scratch folder for Slurm (removed by `finish`)."""
    with _lock:
        if _state["folder"] is None:
            _state["folder"] = Path(tempfile.mkdtemp(prefix="trollout-slurm-"))
        return Path(_state["folder"])


def cluster() -> SlurmCluster:
    """Return the session's single-node Slurm, starting it on the first call.

    Raises:
        SlurmUnavailableError: it cannot be installed or started (the same error every call).
    """
    folder = scratch() / "cluster"
    with _lock:
        if _state["error"] is not None:
            raise _state["error"]
        if _state["cluster"] is None:
            try:
                _state["cluster"] = start_slurm(folder)
            except SlurmUnavailableError as exc:
                _state["error"] = exc
                raise
        return _state["cluster"]  # type: ignore[no-any-return]


class Background:
    """A scenario running in a thread; `result` waits for it (bounded) and returns its value."""

    def __init__(self, name: str, scenario: Callable[[], Any]) -> None:
        self.name = name
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(scenario,), name=name, daemon=True)
        self._thread.start()

    def _run(self, scenario: Callable[[], Any]) -> None:
        try:
            self._value = scenario()
        except BaseException as exc:  # handed to the test that asks (`result`)
            self._error = exc

    def result(self, timeout_s: float) -> Any:
        """Wait for the scenario; return its value, or raise what it raised.

        Raises:
            AssertionError: it is still running after `timeout_s`.
        """
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise AssertionError(f"the Slurm scenario {self.name} is still running")
        if self._error is not None:
            raise self._error
        return self._value


def start_in_background(name: str, scenario: Callable[[], Any]) -> None:
    """Start `scenario` in a thread under `name`, once."""
    with _lock:
        if name not in _started:
            _started[name] = Background(name, scenario)


def started(name: str) -> Background | None:
    """The scenario started under `name`, or None (its test then runs it itself)."""
    with _lock:
        return _started.get(name)


def finish(timeout_s: float) -> None:
    """At the session's end: wait for the scenarios (bounded), stop the cluster, clean up."""
    for background in list(_started.values()):
        background._thread.join(timeout_s)
    with _lock:
        if _state["cluster"] is not None:
            _state["cluster"].stop()
            _state["cluster"] = None
        if _state["folder"] is not None:
            shutil.rmtree(_state["folder"], ignore_errors=True)
            _state["folder"] = None
