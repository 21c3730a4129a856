"""Throughput and memory of the collection hot path, side by side with a NeMo Gym-style baseline.

    .venv/bin/python bench/throughput.py [--rollouts 20000] [--concurrency 1,64,512,4096]
        [--compare-src OTHER_CHECKOUT/src] [--no-episodes]

For each concurrency, the clients run in fresh subprocesses against the same fake deployment
(a separate process, zero latency, no faults), one after the other in this one invocation:

- ``trollout``: the real engine (`open_collector`) writing a real run folder (`RunStore`, default
  fsync policy), exactly what ``trollout collect`` runs after planning.
- ``episode``: the same engine on 0.7.0 materialized task rows, sent to an episode environment
  server as episode requests (docs/protocol.md section 3): the episode path's cost beside the flat
  path's (``trollout``), same server process, same run.
- ``baseline``: asyncio + aiohttp written the way NeMo Gym's collector is: one coroutine per row,
  a semaphore, ``asyncio.as_completed`` over all of them, each result appended as a JSON line.

Reported per client: rollouts/s, client CPU seconds per 1,000 rollouts (user+system CPU of the
client process, measured around the collection only), and peak RSS. Then two memory figures for
trollout: peak RSS with 10,000 rollouts in flight (the server sleeps), and for a 100,000-row input
compared with a 10,000-row one (flat means memory does not follow rows).

With ``--compare-src``, a third client, ``before``, runs the same trollout client code with
``trollout`` imported from another checkout's ``src`` (e.g. a worktree of an older commit), so a
change's cost is measured side by side in one run against the same server.

The machine is shared and noisy: compare ratios within one run, not absolute figures across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from memory import peak_rss_mib  # noqa: E402


def make_rows(n: int, agent: str) -> Iterator[dict[str, Any]]:
    """Materialized rows for `n` distinct arithmetic tasks (streamed: never held at once)."""
    for i in range(n):
        yield {
            "responses_create_params": {
                "input": [{"role": "user", "content": f"What is {i} + {i % 97}?"}],
                "metadata": {"extra_body": json.dumps({"seed": i})},
            },
            "expected_answer": str(i + i % 97),
            "agent_ref": {"name": agent},
            "_ng_task_index": i,
            "_ng_rollout_index": 0,
        }


EPISODE_SERVER = "bench_env"


def make_task_rows(n: int) -> Iterator[dict[str, Any]]:
    """Materialized task rows for `n` distinct tasks, routed to the episode server."""
    for i in range(n):
        yield {
            "task_id": {"taskset": "bench", "task_id": f"bench-{i}"},
            "task_input": {"prompt": f"What is {i} + {i % 97}?"},
            "task_data": {"_ng_digest": f"sha256:{i:064x}", "_ng_dataset_digest": "sha256:0"},
            "_ng_task_index": i,
            "_ng_rollout_index": 0,
            "_ng_environment_server": EPISODE_SERVER,
            "_ng_result_type": "fake_episode_environment",
        }


def write_materialized(path: Path, n: int, agent: str, *, episodes: bool = False) -> None:
    rows = make_task_rows(n) if episodes else make_rows(n, agent)
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# --- clients (each runs in its own subprocess) ------------------------------------------------


def run_trollout(
    url: str, rows_path: Path, out: Path, concurrency: int, name: str = "bench_agent"
) -> dict[str, float]:
    import trio

    from trollout import jsonl
    from trollout.collector.engine.collector import open_collector
    from trollout.records import MaterializedRow
    from trollout.recovery.layout import RunLayout
    from trollout.recovery.store import open_run_store
    from trollout.settings import RunConfig

    config = RunConfig(num_samples_in_parallel=concurrency, output_jsonl_fpath=str(out))
    n = sum(1 for _ in rows_path.open())

    async def main() -> dict[str, float]:
        layout = RunLayout.for_output(out)
        rows = (MaterializedRow.from_body(r) for r in jsonl.read_rows(rows_path))
        async with open_run_store(layout, config, expected=n, fresh=True) as store:
            cpu0, t0 = cpu_seconds(), time.perf_counter()
            async with open_collector(config=config, urls={name: url}, sink=store) as c:
                progress = await c.collect(rows)
            cpu1, t1 = cpu_seconds(), time.perf_counter()
        return {"n": n, "landed": progress.landed, "cpu_s": cpu1 - cpu0, "wall_s": t1 - t0}

    return trio.run(main)


def run_baseline(url: str, rows_path: Path, out: Path, concurrency: int) -> dict[str, float]:
    import aiohttp

    rows = [json.loads(line) for line in rows_path.open()]

    async def main() -> dict[str, float]:
        semaphore = asyncio.Semaphore(concurrency)
        connector = aiohttp.TCPConnector(limit=concurrency)
        cpu0, t0 = cpu_seconds(), time.perf_counter()
        landed = 0
        async with aiohttp.ClientSession(connector=connector) as session:

            async def one(row: dict[str, Any]) -> dict[str, Any]:
                async with semaphore, session.post(url + "/run", json=row) as response:
                    return await response.json()  # type: ignore[no-any-return]

            with out.open("w") as f:
                for future in asyncio.as_completed([one(row) for row in rows]):
                    result = await future
                    f.write(json.dumps(result) + "\n")
                    landed += 1
        cpu1, t1 = cpu_seconds(), time.perf_counter()
        return {"n": len(rows), "landed": landed, "cpu_s": cpu1 - cpu0, "wall_s": t1 - t0}

    return asyncio.run(main())


def client_main(argv: list[str]) -> None:
    kind, url, rows_path, out, concurrency = argv
    if kind == "episode":
        result = run_trollout(url, Path(rows_path), Path(out), int(concurrency), EPISODE_SERVER)
    else:
        fn = run_trollout if kind == "trollout" else run_baseline
        result = fn(url, Path(rows_path), Path(out), int(concurrency))
    result["peak_rss_mib"] = peak_rss_mib()
    print(json.dumps(result))


# --- orchestration ----------------------------------------------------------------------------


def run_client(
    kind: str, url: str, rows_path: Path, out: Path, concurrency: int, src: str | None = None
) -> dict[str, Any]:
    client = "trollout" if kind == "before" else kind
    src = src if kind == "before" else None
    command = [sys.executable, __file__, "--client", client, url, str(rows_path), str(out)]
    env = dict(os.environ, PYTHONPATH=src) if src else None  # `before`: another checkout
    proc = subprocess.run(
        [*command, str(concurrency)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} client failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def report(kind: str, concurrency: int, r: dict[str, Any]) -> str:
    rate = r["landed"] / r["wall_s"]
    cpu_per_k = 1000 * r["cpu_s"] / r["n"]
    return (
        f"{kind:9s} c={concurrency:<5d} {r['landed']:>7d}/{r['n']:<7d} {rate:9.0f} rollouts/s "
        f"{cpu_per_k:7.3f} CPU s/1k  peak RSS {r['peak_rss_mib']:.0f} MiB"
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        client_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=20000)
    parser.add_argument("--concurrency", default="1,64,512,4096")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--compare-src", help="also run trollout imported from this src folder")
    parser.add_argument("--no-episodes", action="store_true", help="skip the episode client")
    args = parser.parse_args()
    kinds = ["trollout", "before", "baseline"] if args.compare_src else ["trollout", "baseline"]
    if not args.no_episodes:
        kinds.insert(1, "episode")
    import attrs

    from trollout.testing import DeploymentSpec, EpisodeServerSpec, spawn_fake_deployment

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        spec = DeploymentSpec.for_benchmark(agents=["bench_agent"], latency_s=0.0)
        episode = EpisodeServerSpec(name=EPISODE_SERVER, tasksets=("bench",))
        spec = attrs.evolve(spec, episode_servers=(episode,))
        with spawn_fake_deployment(spec) as fake:
            urls = {
                "episode": f"http://127.0.0.1:{fake.ports[EPISODE_SERVER]}",
                "flat": fake.run_urls["bench_agent"],
            }
            print(f"fake deployment: {urls} (pid {fake.pid}); {args.rollouts} rollouts per run")
            for concurrency in [int(c) for c in args.concurrency.split(",")]:
                n = args.rollouts if concurrency > 1 else min(args.rollouts, 5000)
                for kind in kinds:
                    path = "episode" if kind == "episode" else "flat"
                    part = folder / f"{path}_rows_{n}.jsonl"
                    if not part.exists():
                        write_materialized(part, n, "bench_agent", episodes=path == "episode")
                    out = folder / f"{kind}_{concurrency}.jsonl"
                    r = run_client(kind, urls[path], part, out, concurrency, args.compare_src)
                    print(report(kind, concurrency, r), flush=True)
        if not args.skip_memory:
            memory_figures(folder)


def memory_figures(folder: Path) -> None:
    from trollout.testing import DeploymentSpec, spawn_fake_deployment

    spec = DeploymentSpec.for_benchmark(agents=["bench_agent"], latency_s=5.0)
    with spawn_fake_deployment(spec) as fake:
        url = fake.run_urls["bench_agent"]
        rows = folder / "inflight.jsonl"
        write_materialized(rows, 10000, "bench_agent")
        r = run_client("trollout", url, rows, folder / "inflight_out.jsonl", 10000)
        print(
            f"10,000 in flight (server sleeps 5 s): peak RSS {r['peak_rss_mib']:.0f} MiB, "
            f"wall {r['wall_s']:.1f} s"
        )
        r = run_client("baseline", url, rows, folder / "inflight_base.jsonl", 10000)
        print(f"  baseline, same: peak RSS {r['peak_rss_mib']:.0f} MiB, wall {r['wall_s']:.1f} s")
    spec = DeploymentSpec.for_benchmark(agents=["bench_agent"], latency_s=0.0)
    with spawn_fake_deployment(spec) as fake:
        url = fake.run_urls["bench_agent"]
        for n in (10000, 100000):
            rows = folder / f"input_{n}.jsonl"
            write_materialized(rows, n, "bench_agent")
            for kind in ("trollout", "baseline"):
                r = run_client(kind, url, rows, folder / f"{kind}_in_{n}.jsonl", 64)
                print(
                    f"{n:>7d}-row input, {kind}: peak RSS {r['peak_rss_mib']:.0f} MiB "
                    f"({r['landed']} landed in {r['wall_s']:.1f} s)"
                )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
