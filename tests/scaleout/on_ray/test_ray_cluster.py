"""Ray runs on real clusters started by ``ray start``: a node lost mid-run, and ``ray job submit``.

The clusters are ``ray start ... --block`` processes on loopback, each in a working directory
of its own (`ray_harness.RayNode`), stopped or killed by pid. In the first test a head (1 CPU)
and a second node (2 CPUs) run the blocks, and the driver (a subprocess joining the head from a
third directory) holds the run's coordinating state; once a block is under way on the second
node, the whole node is killed (every process of it, SIGKILL): its hand-outs are lost and
handed out again to the head, and the run finishes. The second test submits a run with ``ray
job submit`` to a head with its job server (the dashboard: ``ray[default]``; skipped with the
reason without it). Everything waits on files and processes (a block's lock and rows, a
process's exit), never on time.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

ray = pytest.importorskip("ray")

from ray_harness import (  # noqa: E402
    RayNode,
    check_telemetry_adds_up,
    free_port,
    ray_env,
    status,
)
from shard_runs import collect, collect_args, metrics, rollout_set  # noqa: E402

from builders import (  # noqa: E402
    HANG_GUARD_S,
    cli_command,
    count_lines,
    read_jsonl,
    wait_for,
    write_tasks_input,
)
from telemetry.otlp_receiver import otlp_receiver  # noqa: E402
from trollout.recovery.lock import RunLock, read_owner  # noqa: E402
from trollout.scaleout import shard_folders  # noqa: E402
from trollout.testing import (  # noqa: E402
    AgentSpec,
    DeploymentSpec,
    FakeUrls,
    Latency,
    spawn_fake_deployment,
)

pytestmark = pytest.mark.slow

# The head's GCS gives up on a silent node after 3 missed checks 0.5 s apart (default: 5 x 3 s).
_FAST_NODE_DEATH = {
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "500",
    "RAY_health_check_failure_threshold": "3",
}


@attrs.frozen
class TwoNodes:
    """A running two-node cluster: the head's GCS address, and the second node."""

    address: str
    node: RayNode


@pytest.fixture
def two_nodes(tmp_path: Path) -> Iterator[TwoNodes]:
    """A head (1 CPU) and a second node (2 CPUs), each from a directory of its own; both
    stopped by pid at the end (the test has usually killed the second node by then).

    Ray refuses a node joining a cluster unless ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1``, and
    with it Ray's own servers listen on every interface (there is no setting to keep them on
    loopback). So this cluster requires a token (``RAY_AUTH_MODE=token`` with a fresh
    ``RAY_AUTH_TOKEN`` of its own, in the environment only: no token file is read or written),
    and its nodes' addresses are loopback ones: 127.0.0.1 for the head, 127.0.0.3 for the
    second node (a node address of its own, so the driver attaches to the head's raylet).
    """
    head_cwd, node_cwd = tmp_path / "head_cwd", tmp_path / "node_cwd"
    head_cwd.mkdir()
    node_cwd.mkdir()
    env = cluster_env()
    head_args = ["--head", "--port=0", "--num-cpus=1", "--include-dashboard=false"]
    head = RayNode(head_args, head_cwd, tmp_path / "ray_head.log", env)
    node = None
    try:
        address = head.address()
        node_args = [f"--address={address}", "--num-cpus=2", "--node-ip-address=127.0.0.3"]
        node_log = tmp_path / "ray_node.log"
        node = RayNode(node_args, node_cwd, node_log, env)
        # `ray start` says so once the node is registered with the head (its output unbuffered)
        wait_for(lambda: "Ray runtime started" in node_log.read_text(), "the second node",
                 proc=node.proc)  # fmt: skip
        yield TwoNodes(address, node)
    finally:
        if node is not None:
            node.stop()
        head.stop()
    assert list(head_cwd.iterdir()) == [], "a block wrote under the Ray head's directory"
    assert list(node_cwd.iterdir()) == [], "a block wrote under the Ray node's directory"


_CLUSTER_TOKEN = secrets.token_hex(32)


def cluster_env(**extra: str) -> dict[str, str]:
    """The environment of the two-node cluster's nodes and its driver (`two_nodes`)."""
    cluster = {
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": _CLUSTER_TOKEN,
        "PYTHONUNBUFFERED": "1",
        **_FAST_NODE_DEATH,
    }
    return ray_env(**{**cluster, **extra})


def test_ray_run_on_two_nodes_loses_one_and_lands_every_row_once(
    tmp_path: Path, two_nodes: TwoNodes
) -> None:
    """The second node killed mid-run (the driver, and so the run's coordinating state, on
    another machine): the run exits 0, every row lands once, the merged run is the one-machine
    run, and the run's trace and metrics add up to the run folder's counts.

    Two blocks run at once and the head has one CPU, so one of them runs on the second node;
    each rollout takes 0.1 s, one at a time per block, so a block lasts about 2 s, far longer
    than it takes to see one under way there.
    """
    source = write_tasks_input(tmp_path / "tasks.jsonl", 40, seed=17)
    spec = DeploymentSpec(agents=(AgentSpec(name="math_agent"),), latency=Latency(fixed_s=0.1),
                          record_runs=False)  # fmt: skip
    out = tmp_path / "ray" / "run.jsonl"
    driver_cwd = tmp_path / "driver_cwd"
    driver_cwd.mkdir()
    log = tmp_path / "driver.log"
    with spawn_fake_deployment(spec) as fake, otlp_receiver() as (url, received):
        one = tmp_path / "one" / "run.jsonl"
        collect(source, one, fake.head_url)
        args = collect_args(source, out, fake.head_url, "--ray", two_nodes.address,
                            "--workers", "2", "+ray_blocks=4", "--concurrency", "1",
                            "--otlp-endpoint", url)  # fmt: skip
        with log.open("w") as sink:
            driver = subprocess.Popen(cli_command(*args), cwd=driver_cwd,
                                      env=cluster_env(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0"),
                                      stdout=sink, stderr=subprocess.STDOUT)  # fmt: skip
        try:
            wait_for(lambda: busy_on(out, two_nodes.node), "a block under way on the node",
                     proc=driver)  # fmt: skip
            two_nodes.node.kill()
            driver.wait(timeout=HANG_GUARD_S * 2)
        finally:
            if driver.poll() is None:
                driver.kill()
        text = log.read_text()
        assert driver.returncode == 0, text
        assert "worker died" in text
        keys = [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in read_jsonl(out)]
        assert len(keys) == len(set(keys)) == 80
        assert status(out)["complete"]
        assert metrics(out) == metrics(one)
        assert rollout_set(out) == rollout_set(one)
        assert check_telemetry_adds_up(received, out, blocks=4, lost=True) > 4


@pytest.fixture
def head_with_jobs(tmp_path: Path) -> Iterator[str]:
    """A head (2 CPUs) serving Ray's job API on loopback; yields the job server's URL.

    Skipped, with the reason, where the dashboard's packages (``ray[default]``) are missing:
    the job server is part of the dashboard, which the minimal ``ray`` does not include.
    """
    from ray._private.utils import get_dashboard_dependency_error  # what `ray start` checks

    missing = get_dashboard_dependency_error()
    if missing is not None:
        pytest.skip(f"ray job submit needs ray[default] (its dashboard): {missing}")
    head_cwd = tmp_path / "head_cwd"
    head_cwd.mkdir()
    port = free_port()
    args = ["--head", "--port=0", "--num-cpus=2", "--include-dashboard=true",
            "--dashboard-host=127.0.0.1", f"--dashboard-port={port}"]  # fmt: skip
    head = RayNode(args, head_cwd, tmp_path / "ray_head.log", ray_env())
    try:
        head.address()
        yield f"http://127.0.0.1:{port}"
    finally:
        head.stop()


def test_ray_job_submit_runs_collect_on_the_jobs_cluster(
    tmp_path: Path, fake: FakeUrls, head_with_jobs: str
) -> None:
    """``ray job submit -- trollout collect ... --ray`` (docs/scale-out.md): the driver, the
    job's entrypoint, joins the job's cluster with ``--ray`` alone; the job succeeds and the
    run lands every row."""
    source = write_tasks_input(tmp_path / "tasks.jsonl", 8, seed=18)
    out = tmp_path / "ray" / "run.jsonl"
    args = collect_args(source, out, fake.head_url, "--ray", "--workers", "2")
    ray_cli = str(Path(sys.executable).with_name("ray"))
    done = subprocess.run(
        [ray_cli, "job", "submit", "--address", head_with_jobs, "--", *cli_command(*args)],
        env=ray_env(),
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S * 2,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(read_jsonl(out)) == 16
    assert status(out)["complete"]


def busy_on(out: Path, node: RayNode) -> bool:
    """Whether a block is under way (locked, rows landed) in a process of ``node``."""
    pids = node.pids()
    for folder in shard_folders(out):
        owner = read_owner(folder.layout.lock)
        if owner is None or owner.pid not in pids or count_lines(folder.layout.rollouts) < 2:
            continue
        try:
            RunLock.for_layout(folder.layout).check_free()
        except Exception:  # held: the block is running there
            return True
    return False
