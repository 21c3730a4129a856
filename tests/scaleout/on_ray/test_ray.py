"""``collect --ray``: a Ray cluster the tests start on loopback, blocks handed out to workers.

The cluster is this module's own (``ray.init`` with 4 logical CPUs, no dashboard), shut down at
the end; Ray's processes are ended by ``ray.shutdown``, and the one worker a test kills is one
this cluster started, found by the pid in its block's lock. Drivers run in process (so the
driver is measured) or as subprocesses joining the cluster by its address (to be signalled).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from ray_harness import RayNode, check_telemetry_adds_up, ray_env, status  # noqa: E402
from shard_runs import collect, collect_args, metrics, rollout_set  # noqa: E402

from builders import (  # noqa: E402
    HANG_GUARD_S,
    cli_command,
    count_lines,
    invoke,
    read_jsonl,
    wait_for,
    write_tasks_input,
)
from telemetry.otlp_receiver import otlp_receiver  # noqa: E402
from trollout.collector.deployment.discovery import Deployment  # noqa: E402
from trollout.collector.engine.progress import Progress  # noqa: E402
from trollout.errors import RunFolderLockedError, RunStoppedError  # noqa: E402
from trollout.recovery.layout import RunLayout  # noqa: E402
from trollout.recovery.lock import RunLock, read_owner  # noqa: E402
from trollout.scaleout import shard_folders, shard_output  # noqa: E402
from trollout.scaleout.ray import driver as ray_run  # noqa: E402
from trollout.scaleout.ray import merge as ray_merge  # noqa: E402
from trollout.scaleout.ray.block import (  # noqa: E402
    WIND_DOWN,
    BlockReport,
    _run_block,
    _Watcher,
    stop_file,
    write_stop,
)
from trollout.scaleout.ray.handout import HandoutEnd, RayRun  # noqa: E402
from trollout.settings import RunConfig  # noqa: E402
from trollout.testing import (  # noqa: E402
    AgentSpec,
    DeploymentSpec,
    FakeUrls,
    Fault,
    FaultKind,
    spawn_fake_deployment,
    write_fault_script,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A local Ray cluster on loopback (4 logical CPUs); yields its address."""
    temp = tempfile.mkdtemp(prefix="tr-ray-")  # short: Ray's socket paths must fit 107 bytes
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        logging_level="ERROR",
        _temp_dir=temp,
    )
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


def ray_driver(source: Path, output: Path, head: str, address: str, *extra: str) -> list[str]:
    """Return the command line of a Ray run's driver joining the test's cluster."""
    args = collect_args(source, output, head, "--ray", address, *extra)
    return cli_command(*args)


def test_ray_four_workers_give_the_one_machine_run(
    tmp_path: Path, fake: FakeUrls, cluster: str
) -> None:
    """4 workers over 8 blocks: the merged metrics and rollouts are one machine's."""
    source = write_tasks_input(tmp_path / "tasks.jsonl", 40, seed=7)
    one = tmp_path / "one" / "run.jsonl"
    collect(source, one, fake.head_url)
    out = tmp_path / "ray" / "run.jsonl"
    text = collect(source, out, fake.head_url, "--ray", "--workers", "4", "+ray_blocks=8")
    assert "8 blocks over 4 workers" in text
    assert metrics(out) == metrics(one)
    assert rollout_set(out) == rollout_set(one)
    assert len(shard_folders(out, 8)) == 8
    doc = status(out)
    assert doc["complete"]
    assert doc["shards"]["count"] == 8
    assert doc["landed"] == 80


def test_ray_blocks_run_the_drivers_plan_and_never_read_the_input(
    tmp_path: Path, fake: FakeUrls, cluster: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver plans once and writes each block its rows: the input replaced by rows of
    other tasks once the run has started changes nothing (when every block planned the whole
    input itself, the blocks refused the changed input). Blocks are equal in size, each names
    its own rows as its input, and the merged run is the one-machine run of the first input."""
    source = write_tasks_input(tmp_path / "tasks.jsonl", 24, seed=13)
    one = tmp_path / "one" / "run.jsonl"
    collect(source, one, fake.head_url)
    write_start = ray_run._write_start

    def then_replace_the_input(*args: Any) -> None:
        write_start(*args)
        write_tasks_input(source, 24, seed=14)  # other tasks under the same name

    monkeypatch.setattr(ray_run, "_write_start", then_replace_the_input)
    out = tmp_path / "ray" / "run.jsonl"
    collect(source, out, fake.head_url, "--ray", "--workers", "2", "+ray_blocks=4")
    assert metrics(out) == metrics(one)
    assert rollout_set(out) == rollout_set(one)
    sizes = []
    for folder in shard_folders(out, 4):
        manifest = json.loads(folder.layout.manifest.read_text())
        assert manifest["settings"]["input_jsonl_fpath"] == str(folder.layout.materialized_inputs)
        sizes.append(count_lines(folder.layout.materialized_inputs))
    assert sizes == [12, 12, 12, 12]  # 6 tasks of 2 rollouts each


def test_ray_run_is_one_trace_and_its_metrics_add_up_to_the_run_folder(
    tmp_path: Path, fake: FakeUrls, cluster: str
) -> None:
    """Telemetry of a Ray run (--otlp-endpoint, to a receiver on loopback): one trace holds the
    run's span, a span per hand-out and each block's job span; the driver alone exports the
    metrics, summed over the blocks; both add up to the run folder's counts (each block once
    exported counters from 0 under one identity, and started a trace of its own)."""
    source = write_tasks_input(tmp_path / "tasks.jsonl", 20, seed=15)
    out = tmp_path / "ray" / "run.jsonl"
    with otlp_receiver() as (url, received):
        collect(source, out, fake.head_url, "--ray", "--workers", "2", "+ray_blocks=4",
                "--otlp-endpoint", url)  # fmt: skip
    assert check_telemetry_adds_up(received, out, blocks=4) == 4


def test_ray_merges_out_under_the_run_lock(
    tmp_path: Path, fake: FakeUrls, cluster: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OUT is merged while the driver holds the run's lock, so a second collect --overwrite or
    resume cannot take it and delete the shards mid-merge."""
    out = tmp_path / "ray" / "run.jsonl"
    held: list[bool] = []
    merge = ray_merge.aggregate_shards

    async def merge_watched(*args: Any, **kwargs: Any) -> Any:
        try:
            RunLock.for_layout(RunLayout.for_output(out)).check_free()
        except RunFolderLockedError:
            held.append(True)
        else:
            held.append(False)
        return await merge(*args, **kwargs)

    monkeypatch.setattr(ray_merge, "aggregate_shards", merge_watched)
    source = write_tasks_input(tmp_path / "tasks.jsonl", 6, seed=11)
    collect(source, out, fake.head_url, "--ray", "--workers", "2", "+ray_blocks=2")
    assert held == [True]
    assert len(read_jsonl(out)) == 12


def test_ray_worker_killed_mid_run_still_lands_every_rollout_once(
    tmp_path: Path, fake: FakeUrls, cluster: str
) -> None:
    """SIGKILL a worker mid-block: its block is resumed elsewhere, every rollout lands once."""
    source = write_tasks_input(tmp_path / "tasks.jsonl", 60, seed=8)
    out = tmp_path / "ray" / "run.jsonl"
    command = ray_driver(
        source, out, fake.head_url, cluster, "--workers", "2", "--concurrency", "2"
    )
    log = tmp_path / "driver.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, text=True)
    try:
        victim = wait_for_busy_block(out, proc)
        os.kill(victim, signal.SIGKILL)  # a worker of the test's own cluster
        proc.wait(timeout=HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert proc.returncode == 0, text
    assert "worker died" in text
    rows = read_jsonl(out)
    keys = [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows]
    assert len(keys) == len(set(keys)) == 120
    doc = status(out)
    assert doc["complete"]
    # the killed attempts kept their numbers: the resumed block reserved new ones
    assert doc["reserved_attempts"] > doc["expected"]
    assert any(r.get("_ng_attempt_index", 0) > 0 for r in rows)


def test_ray_losing_every_worker_process_mid_run_loses_nothing(
    tmp_path: Path, fake: FakeUrls, cluster: str
) -> None:
    """What losing a worker node does, on the test's one-node cluster: every Ray worker process
    is killed mid-run. The run's coordinating state is the driver's (no actor to lose), so the
    lost blocks are handed out again and the run exits 0 with every rollout once (with a
    control actor on the lost node, the run ended with a traceback)."""
    source = write_tasks_input(tmp_path / "tasks.jsonl", 60, seed=12)
    out = tmp_path / "ray" / "run.jsonl"
    command = ray_driver(
        source, out, fake.head_url, cluster, "--workers", "2", "--concurrency", "2"
    )
    log = tmp_path / "driver.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_busy_block(out, proc)
        victims = ray_worker_pids()
        assert victims
        for pid in victims:  # workers of the test's own cluster (its raylet's children)
            os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert proc.returncode == 0, text
    assert "worker died" in text
    keys = [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in read_jsonl(out)]
    assert len(keys) == len(set(keys)) == 120
    assert status(out)["complete"]


def ray_worker_pids() -> list[int]:
    """Return the pids of the Ray worker processes below this test process (its cluster's)."""
    parents: dict[int, int] = {}
    workers: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # ended meanwhile
        parents[int(entry.name)] = int(stat[1])
        title = command.split(b"\0", 1)[0]  # a worker's: ray::IDLE, ray::run_block
        if title.startswith(b"ray::") and not title.endswith(b"Agent"):  # the raylet's own
            workers.add(int(entry.name))

    def ours(pid: int) -> bool:
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid == os.getpid():
                return True
        return False

    return sorted(pid for pid in workers if ours(pid))


def test_ray_alone_joins_ray_address_as_a_ray_job_driver_does(
    tmp_path: Path, fake: FakeUrls, cluster: str
) -> None:
    """A driver started by ``ray job submit`` has RAY_ADDRESS set to the job's cluster: ``--ray``
    alone joins it (starting a cluster of its own there failed: ray.init refuses num_cpus
    when RAY_ADDRESS names a running cluster)."""
    source = write_tasks_input(tmp_path / "tasks.jsonl", 6, seed=16)
    out = tmp_path / "ray" / "run.jsonl"
    args = collect_args(source, out, fake.head_url, "--ray", "--workers", "2")
    done = subprocess.run(
        cli_command(*args),
        env={**os.environ, "RAY_ADDRESS": cluster},
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S * 2,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(read_jsonl(out)) == 12


def wait_for_busy_block(out: Path, proc: subprocess.Popen[str]) -> int:
    """Wait until some block folder is locked with rows landed; return its owner's pid."""
    found: list[int] = []

    def busy() -> bool:
        for folder in shard_folders(out):
            owner = read_owner(folder.layout.lock)
            if owner is None or count_lines(folder.layout.rollouts) < 2:
                continue
            lock = RunLock.for_layout(folder.layout)
            try:
                lock.check_free()
            except Exception:  # held: the block is running
                found.append(owner.pid)
                return True
        return False

    wait_for(busy, "a block under way", proc=proc)
    return found[0]


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ray_sigint_stops_then_resume_finishes(
    tmp_path: Path, fake: FakeUrls, cluster: str, signum: int, code: int
) -> None:
    """SIGINT or SIGTERM: running blocks wind down, exit 130 or 143 as on one machine, status
    shows the rest; resume completes it."""
    source = write_tasks_input(tmp_path / "tasks.jsonl", 60, seed=9)
    out = tmp_path / "ray" / "run.jsonl"
    command = ray_driver(
        source, out, fake.head_url, cluster, "--workers", "2", "--concurrency", "2"
    )
    log = tmp_path / "driver.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_busy_block(out, proc)
        proc.send_signal(signum)
        proc.wait(timeout=HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert proc.returncode == code, text
    assert "handing out no new block" in text
    doc = status(out)
    assert not doc["complete"]
    assert doc["retryable_remains"]
    assert doc["expected"] == 120
    assert doc["landed"] + doc["to_dispatch"] == 120
    result = invoke("resume", str(out), "--progress", "plain")
    assert result.exit_code == 0, result.output
    assert status(out)["complete"]
    assert len(read_jsonl(out)) == 120


async def test_ray_block_obeys_the_drivers_stop(
    tmp_path: Path, fake: FakeUrls, cluster: str
) -> None:
    """A block started after the driver's stop runs nothing and says so; handed out again,
    it runs to the end."""
    source = write_tasks_input(tmp_path / "tasks.jsonl", 8, seed=3)
    out = shard_output(tmp_path / "run.jsonl", 0, 1)
    config = RunConfig(
        input_jsonl_fpath=str(source),
        output_jsonl_fpath=str(out),
        head_server=fake.head_url,
        agent_name="math_agent",
        shard="0/1",
        resume_from_cache=True,
        disable_aggregation=True,
        grace_s=0.0,
    )
    deployment = Deployment.from_agent_urls(fake.run_urls)
    stop = stop_file(tmp_path / "run.jsonl")
    write_stop(stop, WIND_DOWN, "test")
    report = await _run_block(config, deployment, (0, 1), _Watcher(stop))
    assert report.stopped == "the driver: test"
    assert report.error is None
    stop.unlink()
    again = await _run_block(config, deployment, (0, 2), _Watcher(stop))
    assert not again.interrupted
    assert report.progress.landed + again.progress.landed == 8
    assert len(read_jsonl(out)) == 8


async def test_ray_block_serves_no_prometheus_endpoint(
    tmp_path: Path, fake: FakeUrls, cluster: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks share hosts: one serves neither --metrics-port nor OTEL_METRICS_EXPORTER=
    prometheus, so a port already in use on its host fails no block."""
    source = write_tasks_input(tmp_path / "tasks.jsonl", 4, seed=5)
    out = shard_output(tmp_path / "run.jsonl", 0, 1)
    with socket.socket() as taken:  # the port a block on the same host already serves
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setenv("OTEL_METRICS_EXPORTER", "prometheus")
        monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_PORT", str(port))
        config = RunConfig(
            input_jsonl_fpath=str(source),
            output_jsonl_fpath=str(out),
            agent_name="math_agent",
            shard="0/1",
            resume_from_cache=True,
            disable_aggregation=True,
            metrics_port=port,
        )
        deployment = Deployment.from_agent_urls(fake.run_urls)
        report = await _run_block(config, deployment, (0, 1), _Watcher(stop_file(out)))
    assert report.error is None
    assert report.stopped is None
    assert report.progress.landed == 4


def test_ray_block_whose_worker_gets_sigterm_is_handed_out_again(
    tmp_path: Path, fake: FakeUrls, cluster: str
) -> None:
    """SIGTERM to one worker only (a node drain): its block winds down, is handed out again
    and resumed; the run lands every rollout once and exits 0 (no block silently cut short)."""
    source = write_tasks_input(tmp_path / "tasks.jsonl", 60, seed=10)
    out = tmp_path / "ray" / "run.jsonl"
    command = ray_driver(
        source, out, fake.head_url, cluster, "--workers", "2", "--concurrency", "2",
        "+ray_blocks=2",
    )  # fmt: skip
    log = tmp_path / "driver.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, text=True)
    try:
        victim = wait_for_busy_block(out, proc)
        os.kill(victim, signal.SIGTERM)  # a worker of the test's own cluster
        proc.wait(timeout=HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert proc.returncode == 0, text
    assert "handing it to another" in text
    keys = [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in read_jsonl(out)]
    assert len(keys) == len(set(keys)) == 120
    assert status(out)["complete"]


def test_ray_max_run_time_stops_the_blocks_and_resume_finishes(
    tmp_path: Path, cluster: str
) -> None:
    """--max-run-time on Ray: blocks wind down, exit 1, resumable; resume lands the rest.

    The fault is scripted for the first run only (a fake of its own follows a script file,
    emptied before the resume): on a busy machine the first run may end before it reaches the
    hanging task, whose first attempt then goes out in the resume.
    """
    script = tmp_path / "faults.jsonl"
    write_fault_script(script, {(None, 3, 0, 0, 0): Fault(kind=FaultKind.HANG)})  # never ends
    spec = DeploymentSpec(agents=(AgentSpec(name="math_agent"),), record_runs=False)
    source = write_tasks_input(tmp_path / "tasks.jsonl", 12, seed=4)
    out = tmp_path / "ray" / "run.jsonl"
    with spawn_fake_deployment(spec, fault_script=script) as fake:
        args = collect_args(source, out, fake.head_url, "--ray", "--workers", "2")
        result = invoke(*args, "--max-run-time", "3", "--grace", "0")
        assert result.exit_code == 1, result.output
        assert "--max-run-time reached before every rollout ran" in result.output
        assert not status(out)["complete"]
        write_fault_script(script, {})
        again = invoke("resume", str(out), "--progress", "plain", "--max-run-time", "600")
        assert again.exit_code == 0, again.output
    assert status(out)["complete"]
    assert len(read_jsonl(out)) == 24


def test_ray_run_over_a_run_needs_overwrite_and_then_replaces_it(
    tmp_path: Path, fake: FakeUrls, cluster: str
) -> None:
    """A fresh Ray run over one is refused; --overwrite replaces it, blocks included."""
    out = tmp_path / "ray" / "run.jsonl"
    first = write_tasks_input(tmp_path / "a.jsonl", 10, seed=1)
    collect(first, out, fake.head_url, "--ray", "--workers", "2", "+ray_blocks=4")
    second = write_tasks_input(tmp_path / "b.jsonl", 6, seed=2)
    refused = invoke(*collect_args(second, out, fake.head_url, "--ray", "--workers", "2"))
    assert refused.exit_code == 2
    assert "already holds a run" in refused.output
    collect(second, out, fake.head_url, "--ray", "--workers", "2", "+ray_blocks=3", "--overwrite")
    doc = status(out)
    assert doc["complete"]
    assert doc["expected"] == 12
    assert doc["shards"]["count"] == 3
    assert not list(out.parent.glob("run_shards/*-of-00004/run_manifest.json"))
    assert len(read_jsonl(out)) == 12


def test_ray_block_that_fails_ends_the_run_naming_the_block(
    tmp_path: Path, fake: FakeUrls, cluster: str
) -> None:
    """A block folder in use by another process: the run stops, one line names the block."""
    source = write_tasks_input(tmp_path / "tasks.jsonl", 8, seed=6)
    out = tmp_path / "ray" / "run.jsonl"
    busy = shard_output(out, 1, 2)
    busy.parent.mkdir(parents=True)
    with RunLock.for_layout(RunLayout.for_output(busy)):
        args = collect_args(source, out, fake.head_url, "--ray", "--workers", "2", "+ray_blocks=2")
        result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert "trollout: error: block 1: " in result.output
    assert f"another trollout (pid {os.getpid()}) is collecting into" in result.output
    plain = invoke(*collect_args(source, out, fake.head_url, "--resume"))
    assert plain.exit_code == 2
    assert "is a run collected on Ray; resume it there" in plain.output


# --- a cluster started with `ray start --head`, from another working directory -------------------


@pytest.fixture(scope="module")
def head_elsewhere(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Ray head started with ``ray start --head --block`` (2 CPUs, loopback only) whose
    working directory is not the tests'; yields its address, then stops it by its pid
    (`ray_harness.RayNode`). One for the module: its tests each run a driver of their own from
    a folder of their own, and nothing of a run outlives it in the head; the check that no
    block wrote under the head's directory covers every run on it."""
    folder = tmp_path_factory.mktemp("head_elsewhere")
    elsewhere = folder / "ray_node_cwd"
    elsewhere.mkdir()
    args = ["--head", "--port=0", "--include-dashboard=false", "--num-cpus=2"]
    head = RayNode(args, elsewhere, folder / "ray_head.log", ray_env())
    try:
        yield head.address()
    finally:
        head.stop()
    assert list(elsewhere.iterdir()) == [], "a block wrote under the Ray node's directory"


@pytest.mark.parametrize("relative_input", [True, False], ids=["input-relative", "input-absolute"])
def test_ray_start_cluster_with_relative_paths_lands_every_row_in_the_drivers_folder(
    tmp_path: Path, fake: FakeUrls, head_elsewhere: str, relative_input: bool
) -> None:
    """``collect data/tasks.jsonl --ray ADDRESS -o rel/out.jsonl`` against a ``ray start --head``
    cluster whose working directory is elsewhere: the blocks read the driver's input and write
    under the driver's folder, and the merged OUT holds every rollout (a relative input exited
    2; with an absolute one, OUT was empty and the exit 0)."""
    driver_cwd = tmp_path / "driver_cwd"
    (driver_cwd / "data").mkdir(parents=True)
    source = write_tasks_input(driver_cwd / "data" / "tasks.jsonl", 12, seed=21)
    args = collect_args(
        Path("data/tasks.jsonl") if relative_input else source, Path("rel/out.jsonl"),
        fake.head_url,
        "--ray", head_elsewhere, "--workers", "2", "+ray_blocks=3",
    )  # fmt: skip
    done = subprocess.run(
        cli_command(*args),
        cwd=driver_cwd,
        env=ray_env(),
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S * 2,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = driver_cwd / "rel" / "out.jsonl"
    keys = [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in read_jsonl(out)]
    assert len(keys) == len(set(keys)) == 24
    assert len(shard_folders(out, 3)) == 3
    doc = status(out)
    assert doc["complete"]
    assert doc["landed"] == 24
    assert "Metrics cover: 24 of 24 rollouts" in done.stdout + done.stderr


async def test_ray_driver_that_cannot_read_the_blocks_rows_fails_saying_where(
    tmp_path: Path,
) -> None:
    """Rows in, rows out: blocks that report landed rows the driver's shards folder does not
    hold (a folder the driver does not share with the workers) fail the run, naming it."""
    out = tmp_path / "ray" / "run.jsonl"
    config = RunConfig(output_jsonl_fpath=str(out), ray_blocks=2, ray_workers=2)
    run = RayRun(RunLayout.for_output(out), config, expected=10, to_dispatch=10)
    end = HandoutEnd()
    for block in range(2):
        end.reports[(block, 1)] = BlockReport(block, Progress(landed=5), None, os.getpid())
    with pytest.raises(RunStoppedError, match=r"the blocks landed 10 rollouts, but the driver "
                       r"reads 0 in '.*run_shards'"):  # fmt: skip
        await ray_merge._check_rows_out(run, end, None)
