"""SIGINT and SIGTERM while a huge plan is materialized: prompt exit, no temp file, no loss.

Writing the materialized inputs of a plan of millions of rollouts takes a long time; a signal
there must stop the writer thread at once, remove its temp file and leave the folder as it was
(an old run replaced with --overwrite included). The tests wait for the temp file to grow,
signal, and allow a generous hang guard; how fast the exit is gets measured, not asserted.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import builders
from trollout import jsonl
from trollout.testing import AgentSpec, DeploymentSpec, FakeUrls, task_rows

ROWS, REPEATS = 2_000, 5_000  # 10M rollouts: minutes to materialize, seconds to plan
HANG_GUARD_S = 60.0


@pytest.fixture(scope="module")
def fake_spec() -> DeploymentSpec:
    """Unlike the shared fake's: no detailed /run log (record_runs=False)."""
    return DeploymentSpec(agents=(AgentSpec(name="math_agent"),), record_runs=False)


def command(source: Path, out: Path, fake: FakeUrls, *extra: str) -> list[str]:
    """The `trollout collect` command line of a 10M-rollout plan."""
    return [sys.executable, "-m", "trollout.cli.main", "collect", str(source), "-o", str(out),
            "--agent-url", f"math_agent={fake.run_urls['math_agent']}", "--agent", "math_agent",
            "--num-repeats", str(REPEATS), "--max-rollouts", str(ROWS * REPEATS),
            "--progress", "plain", "--no-aggregate", *extra]  # fmt: skip


def start(argv: list[str], *, sigint: signal.Handlers = signal.SIG_DFL) -> subprocess.Popen[bytes]:
    """Start the CLI with SIGINT's disposition set, not inherited.

    A shell without job control starts background jobs with SIGINT ignored, and the ignoring is
    inherited: a suite run as ``make test &`` from a script would start every child ignoring
    Ctrl-C, and a test of Ctrl-C would wait for an exit that never comes.
    """
    return subprocess.Popen(
        argv, stderr=subprocess.PIPE, preexec_fn=lambda: signal.signal(signal.SIGINT, sigint)
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Kill the child if it still runs, and reap it (no zombie, no warning in a later test)."""
    proc.kill()
    proc.wait()


def wait_for_temp_file(folder: Path, proc: subprocess.Popen[bytes]) -> None:
    """Wait until the materialized inputs' temp file holds bytes (the write is under way)."""
    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        if any(p.stat().st_size for p in folder.glob(".r_materialized_inputs.jsonl.*.tmp")):
            return
        time.sleep(0.02)
    pytest.fail("the materialized inputs were never written")


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """The input: 2,000 example rows (skips where the disk could not hold the plan anyway)."""
    if shutil.disk_usage(tmp_path).free < 8 * 10**9:
        pytest.skip("the 10M-rollout plan needs a few GB of free disk")
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(jsonl.dumps(r) for r in task_rows(ROWS, seed=3)))
    return path


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_during_materialization_exits_at_once_without_temp_files(
    tmp_path: Path, fake: FakeUrls, source: Path, signum: int, code: int
) -> None:
    """A signal mid-write exits 128+signal, removes the temp file, dispatches nothing."""
    out = tmp_path / "run" / "r.jsonl"
    proc = start(command(source, out, fake))
    try:
        wait_for_temp_file(out.parent, proc)
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=HANG_GUARD_S)
    finally:
        stop(proc)
    assert proc.returncode == code, stderr
    assert signal.Signals(signum).name in stderr.decode()
    assert not list(out.parent.glob(".*.tmp"))
    assert not (out.parent / "r_materialized_inputs.jsonl").exists()
    assert sorted(p.name for p in out.parent.iterdir()) == ["r.lock"]  # no run started


@pytest.mark.slow
def test_signal_during_overwrite_keeps_the_old_run(
    tmp_path: Path, fake: FakeUrls, source: Path
) -> None:
    """--overwrite interrupted while the new inputs are written leaves the old run whole."""
    out = tmp_path / "run" / "r.jsonl"
    first = [*command(source, out, fake, "--limit", "3")]
    first[first.index("--num-repeats") + 1] = "1"
    subprocess.run(first, check=True, capture_output=True, timeout=HANG_GUARD_S)
    before = {p.name: p.read_bytes() for p in out.parent.iterdir() if p.name != "r.lock"}
    proc = start(command(source, out, fake, "--overwrite"))
    try:
        wait_for_temp_file(out.parent, proc)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=HANG_GUARD_S)
    finally:
        stop(proc)
    assert proc.returncode == 130, stderr
    after = {p.name: p.read_bytes() for p in out.parent.iterdir() if p.name != "r.lock"}
    assert after == before


def reading(proc: subprocess.Popen[bytes], path: Path) -> bool:
    """Whether ``proc`` has ``path`` open and has read some of it (planning is under way)."""
    fds = Path(f"/proc/{proc.pid}/fd")
    try:
        for fd in fds.iterdir():
            if os.readlink(fd) == str(path):
                info = (fds.parent / "fdinfo" / fd.name).read_text()
                return int(info.split("pos:", 1)[1].split()[0]) > 0
    except (FileNotFoundError, ProcessLookupError):
        pass  # the process or the descriptor went away meanwhile: not yet, or exited
    return False


def materializing(folder: Path) -> bool:
    """Whether the materialized inputs' temp file holds bytes (the write is under way)."""
    return any(p.stat().st_size for p in folder.glob(".r_materialized_inputs.jsonl.*.tmp"))


@pytest.fixture(scope="module")
def big_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """200,000 example rows (~25 MB, seconds to write), read and never changed by the tests."""
    path = tmp_path_factory.mktemp("big") / "in.jsonl"
    path.write_bytes(b"".join(jsonl.dumps(r) for r in task_rows(200_000, seed=5)))
    return path


@pytest.mark.skipif(not Path("/proc/self/fdinfo").is_dir(), reason="needs Linux's /proc")
@pytest.mark.parametrize("phase", ["planning", "materializing"])
def test_sigterm_before_dispatch_exits_143_when_sigint_is_ignored(
    tmp_path: Path, fake: FakeUrls, big_source: Path, phase: str
) -> None:
    """SIGTERM ends a run before dispatch even when SIGINT is ignored (``cmd &`` in a script).

    Without job control a shell starts background jobs with SIGINT ignored, so Trio installs
    no SIGINT handler: SIGTERM must not depend on it. Planning runs Python code (interrupted at
    once), materializing waits for a worker thread inside Trio (the run is cancelled); either
    way nothing is dispatched and no run is left behind.
    """
    source = big_source
    out = tmp_path / "run" / "r.jsonl"
    argv = builders.cli_command(
        "collect", str(source), "-o", str(out), "--agent", "math_agent", "--num-repeats", "2",
        "--agent-url", f"math_agent={fake.run_urls['math_agent']}", "--progress", "plain",
    )  # fmt: skip
    proc = start(argv, sigint=signal.SIG_IGN)  # as `cmd &` does
    try:
        if phase == "planning":
            builders.wait_for(lambda: reading(proc, source), "planning", proc=proc)
        else:
            builders.wait_for(lambda: materializing(out.parent), "materializing", proc=proc)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=builders.HANG_GUARD_S)
    finally:
        stop(proc)
    assert proc.returncode == 143, stderr
    assert "SIGTERM" in stderr.decode()
    assert not (out.parent / "r_attempts.jsonl").exists()  # nothing was dispatched
    assert not out.exists()
    assert not list(out.parent.glob(".*.tmp"))
