"""A real single-node Slurm for the tests: Debian's slurm-wlm and munge, started on loopback.

`start_slurm(folder)` writes a munge key and a ``slurm.conf`` of its own into ``folder`` (ports
picked free, every state, spool, log and pid file inside it), starts ``munged``,
``slurmctld -D`` and ``slurmd -D`` as child processes, and waits until the node is idle. The
`SlurmCluster` it returns runs the client commands (``sbatch``, ``scancel``, ``scontrol``,
``squeue``) with ``SLURM_CONF`` pointing at that file, and `stop` ends exactly the three
processes it started, by pid. Nothing of the machine's own Slurm or munge configuration is read
or changed.

When ``sbatch`` is absent the packages are installed from Debian (``apt-get``, as root) once per
session; the tests skip, with the reason, only when that is impossible or a daemon will not
start. Job states come from ``scontrol show job`` (no accounting daemon is run; the job record
is kept for ``MinJobAge`` seconds, set long here).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

PACKAGES = ("slurm-wlm", "munge")
START_TIMEOUT_S = 60.0


class SlurmUnavailableError(Exception):
    """Slurm cannot be installed or started here (the tests skip with this reason)."""


def ensure_installed() -> None:
    """Install slurm-wlm and munge from Debian when ``sbatch`` is absent (root only)."""
    if shutil.which("sbatch") and shutil.which("slurmctld") and shutil.which("munged"):
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise SlurmUnavailableError("Slurm is not installed and apt-get cannot run as root here")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *PACKAGES]):
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0 and command[1] == "install":
            raise SlurmUnavailableError(f"apt-get install {' '.join(PACKAGES)} failed: "
                                        f"{done.stderr.strip()[-300:]}")  # fmt: skip


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class SlurmCluster:
    """One controller and one node on this machine, all of whose files live in `folder`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.conf = folder / "slurm.conf"
        self.node = "trollout-node"
        self.procs: list[subprocess.Popen[bytes]] = []
        self._log: IO[bytes] | None = None

    @property
    def env(self) -> dict[str, str]:
        """The environment of a client command (and so of every job it submits)."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster."""
        done = subprocess.run(args, env=self.env, capture_output=True, text=True, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(args)} exited {done.returncode}: {done.stderr}")
        return done

    def sbatch(self, script: Path, *options: str) -> int:
        """Submit `script` (with extra command-line `options`); return the job id."""
        out = self.run("sbatch", "--parsable", *options, str(script)).stdout.strip()
        return int(out.split(";")[0])

    def state(self, task: str) -> str | None:
        """Return the state ``squeue`` shows for `task` (``JOB_INDEX`` or a job id), or None."""
        done = self.run("squeue", "-h", "-o", "%i %T", check=False)
        states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
        return states.get(task)

    def jobs(self, job_id: int) -> list[dict[str, str]]:
        """Return every record of job `job_id` (one per array task) as key -> value."""
        done = self.run("scontrol", "-o", "show", "job", str(job_id), check=False)
        records = []
        for line in done.stdout.splitlines():
            fields = dict(word.split("=", 1) for word in line.split() if "=" in word)
            records.append(fields)
        return records

    def wait_finished(self, job_id: int, timeout_s: float) -> list[dict[str, str]]:
        """Wait until no task of `job_id` is pending, running or completing; return them.

        Slurm makes a requeued task eligible again two minutes after the requeue (a fixed
        delay, which ``scontrol update BeginTime=`` cannot shorten), so a wait that spans a
        requeue lasts at least that long.
        """
        deadline = time.monotonic() + timeout_s
        live = {"PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "REQUEUED", "SUSPENDED"}
        while True:
            records = self.jobs(job_id)
            if records and not any(r.get("JobState") in live for r in records):
                return records
            if time.monotonic() > deadline:
                states = [(r.get("JobId"), r.get("JobState")) for r in records]
                raise AssertionError(f"job {job_id} still live after {timeout_s:g} s: {states}")
            time.sleep(0.2)

    def start(self) -> None:
        """Write the configuration, start munged, slurmctld and slurmd, wait for the node."""
        f = self.folder
        for sub in ("munge", "state", "spool", "log"):
            (f / sub).mkdir(parents=True, exist_ok=True)
        (f / "munge").chmod(0o700)
        key = f / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        sock = f / "munge" / "munge.sock"
        host = socket.gethostname().split(".")[0]
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=trollout",
                    f"SlurmctldHost={host}(127.0.0.1)",
                    f"SlurmctldPort={_free_port()}",
                    f"SlurmdPort={_free_port()}",
                    "AuthType=auth/munge",
                    f"AuthInfo=socket={sock}",
                    "CredType=cred/munge",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    f"StateSaveLocation={f / 'state'}",
                    f"SlurmdSpoolDir={f / 'spool'}",
                    f"SlurmctldPidFile={f / 'slurmctld.pid'}",
                    f"SlurmdPidFile={f / 'slurmd.pid'}",
                    f"SlurmctldLogFile={f / 'log' / 'slurmctld.log'}",
                    f"SlurmdLogFile={f / 'log' / 'slurmd.log'}",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_CPU",
                    "JobRequeue=1",
                    "MpiDefault=none",
                    "ReturnToService=2",
                    "SchedulerType=sched/backfill",
                    "MinJobAge=3600",
                    "SlurmdParameters=config_overrides",  # 8 CPUs on a 2-core machine
                    "KillWait=30",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "JobCompType=jobcomp/none",
                    f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs=8 RealMemory=4000 State=UNKNOWN",
                    f"PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE "
                    "State=UP OverSubscribe=FORCE:4",
                    "",
                ]
            )
        )
        log = self._log = (f / "log" / "daemons.out").open("ab")
        munge = [
            "munged", "-F", "-f", f"--socket={sock}", f"--key-file={key}",
            f"--log-file={f / 'log' / 'munged.log'}", f"--pid-file={f / 'munge' / 'munged.pid'}",
            f"--seed-file={f / 'munge' / 'seed'}",
        ]  # fmt: skip
        self._spawn(munge, log)
        self._wait(lambda: sock.exists(), "munged's socket")
        self._spawn(["slurmctld", "-D", "-f", str(self.conf)], log)
        self._spawn(["slurmd", "-D", "-N", self.node, "-f", str(self.conf)], log)
        self._wait(self._idle, "the node to be idle")

    def _spawn(self, args: Sequence[str], log: object) -> None:
        env: Mapping[str, str] = self.env
        proc = subprocess.Popen(args, stdout=log, stderr=log, env=env)  # type: ignore[arg-type]
        self.procs.append(proc)

    def _idle(self) -> bool:
        done = self.run("sinfo", "-h", "-o", "%t", check=False)
        return done.returncode == 0 and done.stdout.strip() == "idle"

    def _wait(self, condition: object, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not condition():  # type: ignore[operator]
            dead = [p.args for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "".join(
                    p.read_text(errors="replace")[-400:] for p in (self.folder / "log").glob("*")
                )
                self.stop()
                raise SlurmUnavailableError(
                    f"Slurm did not start ({what}; exited: {dead}): {logs.strip()[-600:]}"
                )
            time.sleep(0.2)

    def stop(self) -> None:
        """End the daemons this cluster started (by pid, newest first), then wait for them."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()
        if self._log is not None:
            self._log.close()


def start_slurm(folder: Path) -> SlurmCluster:
    """Install if needed, start a cluster in `folder` and return it (the caller stops it)."""
    ensure_installed()
    cluster = SlurmCluster(folder)
    cluster.start()
    return cluster
