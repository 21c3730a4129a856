"""`trollout status RUN --watch`: a live view from another process that ends with the run.

The run is collected in this process against the fake deployment; its last rollouts are held
(503 + Retry-After: 0, re-sent until the test releases them), so the watch, a real subprocess
reading the folder, sees a known state. Everything waits on events (rows on disk, lines in the
watch's output, the process's exit), bounded by HANG_GUARD_S; nothing asserts a duration.
"""

from __future__ import annotations

import io
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from builders import cli_command, collect_config, count_lines, wait_until, write_tasks_input
from trollout.cli.collect import collect_run
from trollout.testing import AgentSpec, DeploymentSpec, Fault, FaultContext, open_fake_deployment

TASKS, HELD = 12, 6
SPEC = DeploymentSpec(agents=(AgentSpec(name="math_agent"),))


class Held:
    """Fault hook: tasks >= TASKS - HELD are refused (503) until `released`; task 1 fails."""

    def __init__(self) -> None:
        self.released = False

    def __call__(self, context: FaultContext) -> Fault | None:
        if context.task_index == 1:
            return Fault(kind="failure_class", failure_class="transient")
        if context.task_index >= TASKS - HELD and not self.released:
            return Fault(kind="status", status=503, retry_after=0)
        return None


async def run_held(tmp_path: Path, body: Callable[[Held, Path], object]) -> None:
    """Collect TASKS rows with the last HELD held; run `body(held, output)` beside the run."""
    held = Held()
    source = write_tasks_input(tmp_path / "tasks.jsonl", TASKS)
    output = tmp_path / "run" / "r.jsonl"
    async with open_fake_deployment(SPEC, fault_fn=held) as fake:
        config = collect_config(
            source,
            output,
            fake.head_url,
            num_samples_in_parallel=TASKS,
            max_request_retries=10**6,
            retry_budget_per_endpoint=10**9,
            breaker_failure_threshold=10**9,
            retry_backoff_base_s=0.01,
            retry_backoff_max_s=0.05,
            disable_aggregation=True,
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                lambda: collect_run(config, progress_stream=io.StringIO(), live=False)
            )
            await body(held, output)  # type: ignore[misc]


def start_watch(output: Path, log: Path) -> subprocess.Popen[str]:
    """Start `trollout status --watch` in its own process, its output going to `log`."""
    command = cli_command("status", str(output), "--watch", "--interval", "0.05")
    with log.open("w") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.PIPE, text=True)


def frames(log: Path) -> list[str]:
    """Return the watch's progress lines so far."""
    return [line for line in log.read_text().splitlines() if " settled (" in line]


@pytest.mark.slow  # waits for the held rollouts to be 2 s old (stragglers)
async def test_status_watch_updates_and_exits_when_the_run_ends(tmp_path: Path) -> None:
    """Held: 6/12 and stragglers shown; released: 12/12, then the watch exits 0 by itself."""
    log = tmp_path / "watch.log"
    procs: list[subprocess.Popen[str]] = []

    async def body(held: Held, output: Path) -> None:
        await wait_until(lambda: count_lines(output) == TASKS - HELD - 1, "the free rows landed")
        await wait_until(lambda: count_lines(output.with_name("r_failures.jsonl")) == 1, "task 1")
        procs.append(start_watch(output, log))
        await wait_until(lambda: any("6/12 settled" in f for f in frames(log)), "a 6/12 frame")
        await wait_until(lambda: "stragglers: task" in log.read_text(), "the held rows listed")
        held.released = True
        await wait_until(lambda: procs[0].poll() is not None, "the watch exited")

    await run_held(tmp_path, body)
    proc = procs[0]
    _, stderr = proc.communicate()
    assert proc.returncode == 0, stderr
    shown = frames(log)
    assert len(shown) >= 2
    assert "12/12 settled" in shown[-1]
    text = log.read_text()
    assert "failed: transient 1" in text
    assert text.rstrip().endswith("collector: ended")


async def test_status_watch_exits_130_on_ctrl_c(tmp_path: Path) -> None:
    """SIGINT while the run goes on: exit 130, no traceback; the run itself is untouched."""
    log = tmp_path / "watch.log"
    result: list[tuple[int, str]] = []

    async def body(held: Held, output: Path) -> None:
        await wait_until(lambda: count_lines(output) == TASKS - HELD - 1, "the free rows landed")
        proc = start_watch(output, log)
        await wait_until(lambda: len(frames(log)) >= 1, "the first frame")
        proc.send_signal(signal.SIGINT)
        await wait_until(lambda: proc.poll() is not None, "the watch exited")
        result.append((proc.returncode, proc.communicate()[1]))
        held.released = True

    await run_held(tmp_path, body)
    [(code, stderr)] = result
    assert code == 130
    assert "Traceback" not in stderr
    assert count_lines(tmp_path / "run" / "r.jsonl") == TASKS - 1  # the run finished regardless


def test_status_watch_refuses_json(tmp_path: Path) -> None:
    """--watch --json: exit 2 with a one-line remedy (the watch is for people)."""
    from builders import invoke

    (tmp_path / "r.jsonl").write_text("")
    result = invoke("status", str(tmp_path / "r.jsonl"), "--watch", "--json")
    assert result.exit_code == 2
    assert "--watch" in result.output


def test_status_watch_on_a_finished_run_shows_it_once_and_exits(tmp_path: Path) -> None:
    """No collector holds the lock: one frame (progress, failures, retries), exit 0."""
    from builders import invoke
    from resume_folders import Folder, failure, landed

    keys = [(t, 0) for t in range(4)]
    folder = Folder(tmp_path, keys).reserve((0, 0, 0), (1, 0, 0), (2, 0, 0), (2, 0, 1))
    folder.land(landed(0, 0), landed(2, 0, 1)).fail(failure(1, 0, cls="skipped", terminal=True))
    folder.fail(failure(2, 0, 0, cls="transient"))
    result = invoke("status", str(folder.layout.output), "--watch", "--interval", "0.05")
    assert result.exit_code == 0, result.output
    assert result.output.count(" settled (") == 1
    assert "3/4 settled (75.0%), 2 landed" in result.output
    assert "failed: skipped 1" in result.output
    assert "retries: 2 failed attempts, 1 rollouts retried" in result.output
    assert result.output.rstrip().endswith("collector: ended")


def test_status_watch_outstanding_follows_the_ledger_and_the_outcomes(tmp_path: Path) -> None:
    """Reserved attempts without an outcome are outstanding, oldest first; outcomes clear them."""
    from resume_folders import Folder, failure, landed
    from trollout.cli.status_watch import Outstanding

    folder = Folder(tmp_path, [(t, 0) for t in range(3)]).reserve((0, 0, 0), (1, 0, 0))
    outstanding = Outstanding(folder.layout)
    outstanding.update(now=100.0)
    folder.reserve((2, 0, 0))
    outstanding.update(now=105.0)
    assert [(key, age) for key, _, age in outstanding.oldest(110.0)] == [
        ((0, 0), 10.0),
        ((1, 0), 10.0),
        ((2, 0), 5.0),
    ]
    folder.land(landed(0, 0)).fail(failure(1, 0, 0))
    outstanding.update(now=111.0)
    assert list(outstanding.since) == [(2, 0)]
    folder.reserve((1, 0, 1))  # a retry of task 1: outstanding again, from now
    outstanding.update(now=112.0)
    assert outstanding.since[(1, 0)] == (1, 112.0)
    assert outstanding.oldest(113.0) == [((2, 0), 0, 8.0)]  # younger than 2 s: not listed


@pytest.mark.parametrize("host", ["this", "node17"])
def test_status_watch_ends_when_the_lock_is_free_whatever_its_record_says(
    tmp_path: Path, host: str
) -> None:
    """A killed collector's record stays behind naming a live (reused) local pid or another
    node: the lock is free, so status says no collector and the watch shows one frame."""
    import json
    import os
    import socket

    from builders import invoke
    from resume_folders import Folder, landed

    folder = Folder(tmp_path, [(0, 0)]).land(landed(0, 0))
    record = {"pid": os.getpid(), "host": socket.gethostname() if host == "this" else host,
              "started_at": 0.0, "token": "stale"}  # fmt: skip
    folder.layout.lock.write_text(json.dumps(record))
    doc = json.loads(invoke("status", str(folder.layout.output), "--json").stdout)
    assert doc["collector_pid"] is None
    result = invoke("status", str(folder.layout.output), "--watch", "--interval", "0.05")
    assert result.exit_code == 0, result.output
    assert result.output.count(" settled (") == 1
    assert result.output.rstrip().endswith("collector: ended")
