"""Measure what the run store costs: 100,000 small outcome rows under each fsync policy.

For each policy (``row``, ``batch``, ``never``) and batch size (outcomes per `RunStore.write`
call, as the engine's writer hands them over), write ``--rows`` small `Landed` outcomes (every
tenth a `Failed`) into a fresh run folder, with the housekeeping task running. Printed per
scenario: wall time, microseconds per row, CPU microseconds per row (the process, threads
included), fsync calls, and the worst event-loop lag seen by a task that ticks every millisecond
(what the rollouts being dispatched would feel).

Then the materialized-inputs file: ``--materialized`` rows (default 1,000,000) streamed from a
generator through `RunStore.write_materialized_inputs`: wall time, growth of peak RSS (streaming
should keep it flat), and the worst event-loop lag while the worker thread writes.

    .venv/bin/python bench/store_write.py [--rows 100000] [--batches 1,64] [--materialized N]
        [--dir /tmp]

The folder is a temp folder under ``--dir`` (the disk under test), removed afterwards.
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import trio

from trollout.records import Failed, Identity, Landed, MaterializedRow, Outcome
from trollout.recovery.layout import RunLayout
from trollout.recovery.store import open_run_store
from trollout.settings import FsyncPolicy, RunConfig


def outcomes(rows: int) -> list[Outcome]:
    """Build small outcomes: a short reply with a reward, every tenth a failure."""
    made: list[Outcome] = []
    for i in range(rows):
        ident = Identity(i // 4, i % 4, agent_name="math_agent")
        if i % 10 == 9:
            made.append(Failed(ident, 0, "agent_run_error", kind="http_500", http_status=500))
        else:
            result = {"response": {"output_text": f"answer {i}"}, "reward": float(i % 2)}
            made.append(Landed(ident, 0, result, elapsed_seconds=0.5))
    return made


async def measure(
    folder: Path, policy: FsyncPolicy, batch: int, rows: list[Outcome]
) -> dict[str, float]:
    """Write ``rows`` in batches; return wall, CPU, fsync count and worst loop lag."""
    fsyncs = 0
    real_fsync = os.fsync

    def counting(fd: int) -> None:
        nonlocal fsyncs
        fsyncs += 1
        real_fsync(fd)

    os.fsync = counting
    lag = 0.0
    done = trio.Event()

    async def ticker() -> None:
        nonlocal lag
        while not done.is_set():
            start = time.perf_counter()
            await trio.sleep(0.001)
            lag = max(lag, time.perf_counter() - start - 0.001)

    layout = RunLayout.for_output(folder / f"{policy.value}_{batch}.jsonl")
    config = RunConfig(fsync=policy)
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ticker)
            async with open_run_store(layout, config, expected=len(rows)) as store:
                nursery.start_soon(store.run_housekeeping)
                for i in range(0, len(rows), batch):
                    await store.write(rows[i : i + batch])
                    await trio.lowlevel.checkpoint()  # as the writer between batches
            done.set()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        os.fsync = real_fsync
    return {"wall": wall, "cpu": cpu, "fsyncs": fsyncs, "lag": lag}


def materialized_rows(count: int) -> Iterator[MaterializedRow]:
    """Generate small materialized rows (about 200 bytes each), one at a time."""
    for i in range(count):
        body = {
            "responses_create_params": {"input": [{"role": "user", "content": f"{i} + {i} = ?"}]},
            "agent_ref": {"name": "math_agent"},
            "expected_answer": str(2 * i),
            "_ng_task_index": i // 4,
            "_ng_rollout_index": i % 4,
        }
        yield MaterializedRow.from_body(body)


async def measure_materialized(folder: Path, count: int) -> dict[str, float]:
    """Write ``count`` materialized rows; return wall, RSS growth (MiB) and worst loop lag."""
    lag = 0.0
    done = trio.Event()

    async def ticker() -> None:
        nonlocal lag
        while not done.is_set():
            start = time.perf_counter()
            await trio.sleep(0.001)
            lag = max(lag, time.perf_counter() - start - 0.001)

    layout = RunLayout.for_output(folder / "materialized.jsonl")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        async with open_run_store(layout, RunConfig(), expected=count) as store:
            wall = time.perf_counter()
            written = await store.write_materialized_inputs(materialized_rows(count))
            wall = time.perf_counter() - wall
        done.set()
    assert written == count
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) / 1024
    size = layout.materialized_inputs.stat().st_size / 2**20
    return {"wall": wall, "rss": grown, "lag": lag, "size": size}


async def main(args: argparse.Namespace) -> None:
    """Run every scenario and print one line each."""
    print(f"folder under {args.dir or tempfile.gettempdir()}")
    if args.materialized:
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            m = await measure_materialized(Path(tmp), args.materialized)
        print(
            f"materialized inputs: {args.materialized} rows ({m['size']:.0f} MiB) in "
            f"{m['wall']:.2f} s ({m['wall'] / args.materialized * 1e6:.2f} us/row); peak RSS "
            f"+{m['rss']:.1f} MiB; max loop lag {m['lag'] * 1e3:.1f} ms"
        )
    rows = outcomes(args.rows)
    print(f"outcomes: {args.rows} rows per scenario")
    print(
        f"{'policy':>7} {'batch':>6} {'wall s':>8} {'us/row':>8} {'cpu us/row':>11} "
        f"{'fsyncs':>7} {'max loop lag ms':>16}"
    )
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for batch in args.batches:
            for policy in (FsyncPolicy.ROW, FsyncPolicy.BATCH, FsyncPolicy.NEVER):
                r = await measure(Path(tmp), policy, batch, rows)
                n = args.rows
                print(
                    f"{policy.value:>7} {batch:>6} {r['wall']:>8.2f} {r['wall'] / n * 1e6:>8.1f} "
                    f"{r['cpu'] / n * 1e6:>11.1f} {int(r['fsyncs']):>7} {r['lag'] * 1e3:>16.1f}"
                )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 64])
    parser.add_argument("--materialized", type=int, default=1_000_000)
    parser.add_argument("--dir", default=None, help="folder on the disk to measure")
    trio.run(main, parser.parse_args())
