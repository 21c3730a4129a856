"""The fake deployment in its own process: ``python -m trollout.testing serve``.

`serve_until_signal` is what the subprocess runs: it opens the deployment, prints one JSON line
(the `FakeUrls` plus ``pid``) on stdout when every socket listens, and serves until SIGTERM or
SIGINT. `spawn_fake_deployment` is the parent's side: it starts that process, waits for the
ready line, yields the URLs and terminates the process (by its pid) on exit.

A separate process is what benchmarks and crash tests need: the fake then has its own core and
its own GIL, and the collector under test can be killed without taking the servers with it.
"""

from __future__ import annotations

import os
import resource
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

import attrs
import orjson
import trio
import yaml

from ..errors import DeploymentError
from .deployment import FakeUrls, open_fake_deployment
from .faults import FaultFn
from .spec import DeploymentSpec, load_spec, spec_to_dict

__all__ = ["raise_fd_limit", "serve_until_signal", "spawn_fake_deployment"]


def raise_fd_limit() -> None:
    """Raise this process's open-file limit to its hard limit (10k connections need it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def serve_until_signal(
    spec: DeploymentSpec,
    *,
    port_base: int | None = None,
    record_runs: bool | None = None,
    fault_fn: FaultFn | None = None,
) -> None:
    """Serve ``spec``, print the ready line, and return on SIGTERM or SIGINT.

    Args:
        spec: the deployment.
        port_base: fixed ports from this number (head first); default: any free ports.
        record_runs: keep the detailed ``/run`` log (None: as the spec says).
        fault_fn: the fault hook (a `FaultScript` for ``--fault-script``).

    Cancellation:
        Serves until a signal arrives or the caller cancels; either way every server is
        closed on return.
    """
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with open_fake_deployment(
            spec, port_base=port_base, record_runs=record_runs, fault_fn=fault_fn
        ) as fake:
            ready = attrs.evolve(fake.urls, pid=os.getpid()).to_json()
            sys.stdout.write(orjson.dumps(ready).decode() + "\n")
            sys.stdout.flush()
            async for _ in signals:
                break


def _spec_file(stack: ExitStack, spec: DeploymentSpec | str | os.PathLike[str]) -> str:
    if not isinstance(spec, DeploymentSpec):
        load_spec(spec)  # fail here, with the file's name, rather than in the child
        return os.fspath(spec)
    folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="trollout-fake-"))
    path = Path(folder, "spec.yaml")
    path.write_text(yaml.safe_dump(spec_to_dict(spec), sort_keys=False), encoding="utf-8")
    return str(path)


def _command(
    spec_path: str,
    port_base: int | None,
    sleep_s: float | None,
    record_runs: bool | None,
    fault_script: str | os.PathLike[str] | None = None,
) -> list[str]:
    command = [sys.executable, "-m", "trollout.testing", "serve", "--spec", spec_path]
    if fault_script is not None:
        command += ["--fault-script", os.fspath(fault_script)]
    if port_base is not None:
        command += ["--port-base", str(port_base)]
    if sleep_s is not None:
        command += ["--sleep", repr(sleep_s)]
    if record_runs is False:
        command.append("--no-record-runs")
    return command


def _wait_ready(proc: subprocess.Popen[bytes], ready_timeout_s: float) -> FakeUrls:
    assert proc.stdout is not None
    deadline = time.monotonic() + ready_timeout_s
    while (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select([proc.stdout], [], [], left)
        if not readable:
            break
        line = proc.stdout.readline()
        if not line:
            raise DeploymentError(
                f"the fake deployment (pid {proc.pid}) exited with code {proc.wait()!r} before "
                "it was ready; see its stderr above"
            )
        return FakeUrls.from_json(orjson.loads(line))
    raise DeploymentError(
        f"the fake deployment (pid {proc.pid}) printed no ready line within "
        f"{ready_timeout_s!r} s; raise ready_timeout_s or check its stderr"
    )


def _stop(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    if proc.poll() is None:
        proc.terminate()  # SIGTERM to this pid only
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


@contextmanager
def spawn_fake_deployment(
    spec: DeploymentSpec | str | os.PathLike[str],
    *,
    port_base: int | None = None,
    sleep_s: float | None = None,
    record_runs: bool | None = None,
    ready_timeout_s: float = 30.0,
    extra_args: Sequence[str] = (),
    fault_script: str | os.PathLike[str] | None = None,
) -> Iterator[FakeUrls]:
    """Run a fake deployment in a subprocess for the duration of the ``with`` block.

    Args:
        spec: a `DeploymentSpec` (written to a temporary YAML file) or a spec file path.
        port_base: fixed ports from this number (head first); default: any free ports.
        sleep_s: every ``/run`` sleeps this long and nothing fails (memory benchmarks).
        record_runs: False drops the detailed ``/run`` log (``GET /_fake/runs`` on the
            head); None keeps what the spec says.
        ready_timeout_s: how long to wait for the ready line.
        extra_args: more arguments for ``python -m trollout.testing serve``.
        fault_script: a `FaultScript` file the fake follows (re-read when it changes; it may
            not exist yet).

    Raises:
        DeploymentError: the process exited or stayed silent before it was ready.
    """
    with ExitStack() as stack:
        path = _spec_file(stack, spec)
        command = [*_command(path, port_base, sleep_s, record_runs, fault_script), *extra_args]
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        try:
            yield _wait_ready(proc, ready_timeout_s)
        finally:
            _stop(proc, grace_s=10.0)
