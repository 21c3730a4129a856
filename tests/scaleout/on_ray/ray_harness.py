"""What the Ray tests share: real Ray nodes (``ray start --block`` processes on loopback, each
in a working directory and a session folder of its own, stopped or killed, node and all, by
pid), and the checks of a run's status and telemetry.

Never ``ray stop``: that stops every Ray process of the machine's user, other tests' and other
people's included. Token authentication is off for both sides (``RAY_AUTH_MODE=disabled``):
the nodes bind 127.0.0.1 only, and a test must neither read nor write the token file Ray keeps
in the user's home.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections import Counter
from contextlib import suppress
from pathlib import Path
from typing import IO, Any

from builders import HANG_GUARD_S, count_lines, invoke, wait_for


def ray_env(**extra: str) -> dict[str, str]:
    """The environment of the tests' Ray nodes and drivers: loopback only, no token auth."""
    return {
        **os.environ,
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_AUTH_MODE": "disabled",
        **extra,
    }


def reachable(address: str) -> bool:
    """Whether something listens at ``host:port``."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=1.0).close()
    except OSError:
        return False
    return True


def free_port() -> int:
    """Return a port free on 127.0.0.1 now (for a server that cannot be given port 0)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class RayNode:
    """One ``ray start ... --block`` process: the node's processes are its descendants.

    Its session files live in a short temporary folder of its own (socket paths must fit 107
    bytes), removed by `stop`.
    """

    def __init__(self, args: list[str], cwd: Path, log: Path, env: dict[str, str]) -> None:
        self.temp = Path(tempfile.mkdtemp(prefix="tr-rn-"))
        ray_cli = Path(sys.executable).with_name("ray")
        command = [str(ray_cli), "start", *args, f"--temp-dir={self.temp}"]
        if not any(arg.startswith("--node-ip-address=") for arg in args):
            command.append("--node-ip-address=127.0.0.1")
        command += ["--disable-usage-stats", "--block"]
        self.log: IO[str] = log.open("w")
        self.proc = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=self.log, stderr=subprocess.STDOUT
        )

    def address(self) -> str:
        """Wait for a head's GCS; return its address (``host:port``)."""
        address_file = self.temp / "ray_current_cluster"
        wait_for(lambda: address_file.exists() and address_file.read_text().strip() != "",
                 "the Ray head's address", proc=self.proc)  # fmt: skip
        address = address_file.read_text().strip()
        wait_for(lambda: reachable(address), "the Ray head's GCS", proc=self.proc)
        return address

    def pids(self) -> set[int]:
        """Return the node's live processes: the ``ray start`` process and its descendants."""
        parents = process_parents()
        found = {self.proc.pid}
        frontier = {self.proc.pid}
        while frontier:
            frontier = {pid for pid, parent in parents.items() if parent in frontier}
            found |= frontier
        return found

    def kill(self) -> None:
        """Lose the node: SIGKILL every process of it at once, as a machine that dies."""
        for pid in self.pids():
            with suppress(ProcessLookupError):  # ended meanwhile
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(timeout=HANG_GUARD_S)

    def stop(self) -> None:
        """Stop the node (``ray start --block`` stops its processes on SIGTERM), by pid."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=HANG_GUARD_S)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()
        shutil.rmtree(self.temp, ignore_errors=True)


def process_parents() -> dict[int, int]:
    """Return every live process's parent pid, from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # ended meanwhile
            parents[int(entry.name)] = int(fields[1])
    return parents


def status(output: Path) -> dict[str, Any]:
    """Return ``trollout status OUT --json``."""
    result = invoke("status", str(output), "--json")
    assert result.exit_code == 0, result.output
    doc: dict[str, Any] = json.loads(result.output)
    return doc


def check_telemetry_adds_up(received: Any, out: Path, *, blocks: int, lost: bool = False) -> int:
    """Assert the run's spans form one trace and its spans and metrics count the folder's
    landed rollouts (`scaleout.ray.telemetry`); return the hand-outs (``lost``: some hand-outs
    died with their worker, so their job and attempt spans may never have been sent)."""
    landed = status(out)["landed"]
    assert landed == count_lines(out)
    spans = {name: [s for s in received.spans if s.name == name] for name in
             ("ray.run", "ray.block", "job", "dispatch")}  # fmt: skip
    [run] = spans["ray.run"]
    handouts = span_attributes(run)["trollout.ray.handouts"]
    assert len(spans["ray.block"]) == handouts >= blocks
    assert {s.trace_id for s in spans["ray.block"] + spans["job"]} == {run.trace_id}
    block_spans = {s.span_id for s in spans["ray.block"]}
    assert {s.parent_span_id for s in spans["ray.block"]} == {run.span_id}
    assert {s.parent_span_id for s in spans["job"]} <= block_spans
    assert span_attributes(run)["trollout.rollouts.landed"] == landed
    last: dict[int, Any] = {}  # each block's last hand-out
    for span in spans["ray.block"]:
        attributes = span_attributes(span)
        block, number = attributes["trollout.block"], attributes["trollout.block.handout"]
        if block not in last or number > last[block][0]:
            last[block] = (number, attributes.get("trollout.block.landed"))
    assert len(last) == blocks
    assert sum(landed_then for _, landed_then in last.values()) == landed
    jobs = {s.span_id for s in spans["job"]}
    links = {link.span_id for s in spans["dispatch"] for link in s.links}
    assert lost or links <= jobs
    [export] = received.metrics["trollout.rollouts"][-1:]
    outcomes: Counter[str] = Counter()
    for point in export.sum.data_points:
        point_attributes = {kv.key: kv.value.string_value for kv in point.attributes}
        outcomes[point_attributes["outcome"]] += point.as_int
    assert outcomes["landed"] == landed
    return int(handouts)


def span_attributes(span: Any) -> dict[str, Any]:
    """Return a decoded OTLP span's attributes as Python values."""
    values: dict[str, Any] = {}
    for kv in span.attributes:
        kind = kv.value.WhichOneof("value")
        values[kv.key] = getattr(kv.value, kind) if kind else None
    return values
