"""One process against 4 Ray workers, with 200 ms of latency per rollout.

    .venv/bin/python bench/scaleout.py [--tasks 2000] [--repeats 2] [--concurrency 32]
        [--workers 4] [--latency 0.2]

The fake deployment runs in its own process and answers every ``/run`` after ``--latency``
seconds (its `Latency`). Both runs collect the same input with the same per-process concurrency
and no aggregation, one after the other in this invocation:

- ``1 process``: `collect_run` in this process, as ``trollout collect`` runs it.
- ``ray N cold``: `collect_on_ray` in this process, driving a local Ray cluster this script
  starts on loopback (``--workers`` blocks in flight, 4 blocks per worker): the first run on
  the cluster, so its workers start (and import trollout) during it;
- ``ray N warm``: the same run again into a new folder, on the same cluster's started workers.

Reported: rollouts per second (rollouts over the run's own elapsed time: planning, every
block's planning and hand-outs included; aggregation excluded for all), and CPU seconds per
1,000 rollouts: this process's for ``1 process``; for Ray, this process's plus every Ray
process's (GCS, raylet, workers, actors; read from /proc every 0.1 s during the run, so a
process that ends before the run does is counted to its last reading: `RayCpu`). Ray's added CPU
per rollout is the difference with ``1 process``. The machine is shared and noisy: compare
within one run.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback only

import attrs
import ray
import trio

from trollout import jsonl
from trollout.cli.collect import collect_run
from trollout.run import StreamObserver
from trollout.scaleout.ray.driver import collect_on_ray
from trollout.settings import RunConfig
from trollout.testing import (
    AgentSpec,
    DeploymentSpec,
    Latency,
    spawn_fake_deployment,
    task_rows,
)

_TICK = os.sysconf("SC_CLK_TCK")
_SAMPLE_S = 0.1


def cpu_of(pids: set[int]) -> float:
    """Return the user+system CPU seconds the live processes ``pids`` have used."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        total += (int(fields[11]) + int(fields[12])) / _TICK
    return total


def descendants(root: int, exclude: int) -> set[int]:
    """Return every live process below ``root`` (this script), ``exclude``'s tree left out."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier and p != exclude}
        found |= frontier
    return found


def self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_one(config: RunConfig) -> tuple[float, float]:
    """Collect in this process; return (elapsed s, CPU s)."""
    cpu = self_cpu()
    with open(os.devnull, "w") as quiet:
        result = trio.run(lambda: collect_run(config, live=False, progress_stream=quiet))
    return result.elapsed_s, self_cpu() - cpu


class RayCpu:
    """Samples the CPU of every process below this one (the fake's tree left out) every
    `_SAMPLE_S` seconds in a thread, keeping each process's last reading, so a process that
    ends during the run (an actor, a worker Ray ends) still counts up to its last sample.
    The sampler's own CPU is left out of this process's."""

    def __init__(self, exclude: int) -> None:
        self.exclude = exclude
        self.seen: dict[int, float] = {}
        self.sampler_cpu = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        pids = descendants(os.getpid(), self.exclude)
        for pid in pids:
            self.seen[pid] = cpu_of({pid})

    def _run(self) -> None:
        start = time.thread_time()
        while not self._stop.wait(_SAMPLE_S):
            self.sample()
        self.sampler_cpu = time.thread_time() - start

    def __enter__(self) -> RayCpu:
        self.sample()
        self.before = dict(self.seen)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    @property
    def used(self) -> float:
        """CPU seconds the sampled processes used meanwhile."""
        return sum(cpu - self.before.get(pid, 0.0) for pid, cpu in self.seen.items())


def run_ray(config: RunConfig, fake_pid: int) -> tuple[float, float]:
    """Collect on the local cluster; return (elapsed s, CPU s of this process and Ray's)."""
    before = self_cpu()
    with RayCpu(fake_pid) as ray_cpu, open(os.devnull, "w") as quiet:
        result = trio.run(lambda: collect_on_ray(config, observer=StreamObserver(quiet)))
    own = self_cpu() - before - ray_cpu.sampler_cpu
    return result.elapsed_s, own + ray_cpu.used


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--latency", type=float, default=0.2)
    args = parser.parse_args()
    spec = DeploymentSpec(
        agents=(AgentSpec(name="math_agent"),),
        latency=Latency(fixed_s=args.latency),
        record_runs=False,
    )
    folder = Path(tempfile.mkdtemp(prefix="tr-bench-"))
    source = folder / "tasks.jsonl"
    source.write_bytes(b"".join(jsonl.dumps(r) for r in task_rows(args.tasks, seed=1)))
    rollouts = args.tasks * args.repeats
    with spawn_fake_deployment(spec) as urls:
        base = RunConfig(
            input_jsonl_fpath=str(source),
            head_server=urls.head_url,
            agent_name="math_agent",
            num_repeats=args.repeats,
            num_samples_in_parallel=args.concurrency,
            disable_aggregation=True,
            timing_summary_interval_s=None,
        )
        one = attrs.evolve(base, output_jsonl_fpath=str(folder / "one" / "run.jsonl"))
        elapsed1, cpu1 = run_one(one)
        ray_temp = tempfile.mkdtemp(prefix="tr-ray-")
        ray.init(
            num_cpus=args.workers,
            include_dashboard=False,
            log_to_driver=False,
            logging_level="ERROR",
            _temp_dir=ray_temp,
        )
        try:
            time.sleep(2.0)  # let the cluster's own start-up settle before measuring
            distributed = attrs.evolve(base, ray_address="local", ray_workers=args.workers)
            runs = []
            for name in ("cold", "warm"):
                out = str(folder / name / "run.jsonl")
                runs.append(
                    run_ray(attrs.evolve(distributed, output_jsonl_fpath=out), urls.pid or -1)
                )
        finally:
            ray.shutdown()
            shutil.rmtree(ray_temp, ignore_errors=True)
    shutil.rmtree(folder, ignore_errors=True)
    print(
        f"{rollouts} rollouts, {args.latency * 1000:.0f} ms each, concurrency "
        f"{args.concurrency} per process, python {sys.version.split()[0]}"
    )
    print(f"{'':<14} {'rollouts/s':>10} {'CPU s/1k':>9} {'added CPU ms/rollout':>21}")
    print(f"{'1 process':<14} {rollouts / elapsed1:>10.1f} {1000 * cpu1 / rollouts:>9.2f}")
    for name, (elapsed, cpu) in zip(("cold", "warm"), runs, strict=True):
        label = f"ray {args.workers} {name}"
        added = 1000 * (cpu - cpu1) / rollouts
        rate, per_1k = rollouts / elapsed, 1000 * cpu / rollouts
        print(f"{label:<14} {rate:>10.1f} {per_1k:>9.2f} {added:>21.2f}")


if __name__ == "__main__":
    main()
