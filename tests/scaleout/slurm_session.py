"""One Slurm for the test session, and Slurm scenarios that run beside the rest of the suite.

Why beside: a Slurm scenario mostly waits on Slurm's own clocks (a task requeued by Slurm is
eligible again only two minutes later, a fixed delay; a 3-minute ``--time`` signals a minute
in), so run in series it would add three idle minutes to ``make test``. `start_in_background`
starts such a scenario from the moment collection ends (tests/scaleout/conftest.py), while the
other tests run; its test only checks the result (`Background.result`), so the wait overlaps
the suite instead of adding to it. Only scenarios whose test is selected are started.

Why in a child process (`slurm_child`), not a thread of the test process: a thread shares what
other tests measure about their own process. The scenario's pipes and HTTP polls showed up in
descriptor checks (a transport test saw 21 descriptors for 19) and its allocations in
tracemalloc peaks (a planning test saw 41 B per row for under 8). The child installs and starts
the session's Slurm, writes ``cluster.ready`` (or ``cluster.error``, why it cannot), runs the
scenarios, writes each result as JSON, and keeps the cluster up until this process closes its
stdin (`finish`, or this process dying), then stops the daemons it started, by pid. Nothing of
it runs in the test process but a file check when a test asks.

`cluster` returns the child's cluster (attached by its folder: the client commands only need its
``slurm.conf``), or, when no scenario was started (a Slurm test run alone), starts one in this
process, stopped by `finish`. A scenario runs the trollout command line as subprocesses and
returns JSON (lists, not sets); it must bound every wait itself.

Rejected: a thread (above); running the memory and descriptor tests last, after the scenario
(they would wait for it, and every new such test would need the mark); pytest-xdist (every test
of the suite would then need to be safe to run in parallel processes, for one scenario).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import suppress
from pathlib import Path
from typing import IO, Any

from slurm_cluster import SlurmCluster, SlurmUnavailableError, start_slurm

HERE = Path(__file__).resolve().parent
READY, ERROR, PIDS = "cluster.ready", "cluster.error", "cluster.pids"
INSTALL_AND_START_S = 15 * 60.0  # apt-get on a fresh machine, then the daemons

_state: dict[str, Any] = {"cluster": None, "error": None, "folder": None, "child": None}


def scratch() -> Path:
    """The session's own scratch folder for Slurm (removed by `finish`)."""
    if _state["folder"] is None:
        _state["folder"] = Path(tempfile.mkdtemp(prefix="trollout-slurm-"))
    return Path(_state["folder"])


def cluster() -> SlurmCluster:
    """Return the session's single-node Slurm: the child's when one runs, else started here.

    Raises:
        SlurmUnavailableError: it cannot be installed or started (the same error every call).
    """
    if _state["error"] is not None:
        raise _state["error"]
    if _state["cluster"] is None:
        try:
            child: Child | None = _state["child"]
            _state["cluster"] = child.cluster() if child else start_slurm(scratch() / "cluster")
        except SlurmUnavailableError as exc:
            _state["error"] = exc
            raise
    return _state["cluster"]  # type: ignore[no-any-return]


class Child:
    """The child process running the session's Slurm and its background scenarios."""

    def __init__(self, folder: Path, names: list[str]) -> None:
        self.folder = folder
        self.log: IO[bytes] = (folder / "child.log").open("ab")
        tests = str(HERE.parent)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), tests])}
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "slurm_child.py"), str(folder), *names],
            stdin=subprocess.PIPE,
            stdout=self.log,
            stderr=self.log,
            env=env,
        )

    def wait_for_file(self, *names: str, timeout_s: float, what: str) -> Path:
        """Return the first of ``names`` to appear in the folder; fail if the child ends first."""
        deadline = time.monotonic() + timeout_s
        while True:
            for name in names:
                if (self.folder / name).exists():
                    return self.folder / name
            if self.proc.poll() is not None:
                raise AssertionError(f"the Slurm child exited {self.proc.returncode} before "
                                     f"{what}: {self.tail()}")  # fmt: skip
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} did not happen within {timeout_s:g} s: {self.tail()}")
            time.sleep(0.5)

    def cluster(self) -> SlurmCluster:
        found = self.wait_for_file(
            READY, ERROR, timeout_s=INSTALL_AND_START_S, what="the session's Slurm"
        )
        if found.name == ERROR:
            raise SlurmUnavailableError(found.read_text())
        return SlurmCluster(self.folder / "cluster")  # attached: the child owns the daemons

    def tail(self) -> str:
        log = self.folder / "child.log"
        return log.read_text(errors="replace")[-2000:] if log.exists() else ""

    def stop(self, timeout_s: float) -> None:
        """Close its stdin (it stops its daemons and exits); kill what outlives the bound."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pids = self.folder / PIDS
            for pid in pids.read_text().split() if pids.exists() else []:
                with suppress(ProcessLookupError):  # the daemons it started, by pid
                    os.kill(int(pid), signal.SIGKILL)
        self.log.close()


class Background:
    """A scenario running in the child; `result` waits for it (bounded) and returns its value."""

    def __init__(self, child: Child, name: str) -> None:
        self.child = child
        self.name = name

    def result(self, timeout_s: float) -> Any:
        """Wait for the scenario; return its JSON value, or raise what it raised.

        Raises:
            AssertionError: it failed, or is still running after ``timeout_s``.
            SlurmUnavailableError: Slurm could not start.
        """
        found = self.child.wait_for_file(
            f"{self.name}.json", f"{self.name}.error", ERROR,
            timeout_s=timeout_s, what=f"the Slurm scenario {self.name}",
        )  # fmt: skip
        if found.name == ERROR:
            raise SlurmUnavailableError(found.read_text())
        if found.suffix == ".error":
            raise AssertionError(f"the Slurm scenario {self.name} failed:\n{found.read_text()}")
        return json.loads(found.read_text())


_started: dict[str, Background] = {}


def start_in_background(names: list[str]) -> None:
    """Start the child with these scenarios (by name, `slurm_scenarios.SCENARIOS`), once."""
    if _state["child"] is None and names:
        child = _state["child"] = Child(scratch(), names)
        for name in names:
            _started[name] = Background(child, name)


def started(name: str) -> Background | None:
    """The scenario started under `name`, or None (its test then runs it itself)."""
    return _started.get(name)


def finish(timeout_s: float) -> None:
    """At the session's end: stop the child (it stops its Slurm) or this process's own Slurm,
    then remove the scratch folder."""
    child: Child | None = _state["child"]
    if child is not None:
        child.stop(timeout_s)
    elif _state["cluster"] is not None:
        _state["cluster"].stop()
    _state.update(cluster=None, child=None)
    if _state["folder"] is not None:
        shutil.rmtree(_state["folder"], ignore_errors=True)
        _state["folder"] = None
