"""CPU per rollout and peak RSS of trollout's front ends, against the CLI, in one run.

    .venv/bin/python bench/frontends.py [--batches 20] [--rows 1000] [--concurrency 64]

One fake deployment (its own process, zero latency, no faults); each client runs in a fresh
subprocess, one after the other, and sends ``batches x rows`` rollouts:

- ``cli``: ``trollout collect`` (in-process click call) over one input of every row, run folder
  written (the CLI has no batches);
- ``trio``: `trollout.open_rollouts`, a batch per step, every outcome iterated;
- ``trio+shards``: the same, each batch recorded as a shard (a run folder per step);
- ``aio``: `trollout.aio` under ``asyncio.run`` (Trio in a thread), a 10 ms ticker task beside
  (each step's rows are made in a worker thread, as a trainer would keep planning off its loop,
  so the ticker measures trollout, not the bench);
- ``aio+shards``: the same, each batch recorded as a shard (the loop's stall with shards);
- ``aio-guest``: the same front end with Trio started in guest mode on the asyncio loop instead
  of a thread (the alternative `driver.bridge` rejects; built here only to measure it);
- ``trio-asyncio``: an asyncio trainer run by ``trio_asyncio`` (Trio hosts asyncio), calling
  ``Rollouts.run_batch`` once per step through ``trio_as_aio``;
- ``sync``: `trollout.sync` from plain blocking code;
- ``nemo-gym``: the NeMo Gym drop-in (`trollout.nemo_gym`), one ``run_examples`` per step
  iterated as NeMo Gym's API is (``for future in completions: await future``), the same ticker
  beside; each call opens and closes its own collector thread (the drop-in's design), so
  this is ``aio`` plus that per-step cost and an awaitable per rollout.

``--fsync never`` runs the trio and aio clients under that policy (a shard then fsyncs nothing).
``--prior-shards N`` starts the shard clients' folder with N earlier steps' files (empty, six
per step, as a long training run's folder holds), to show that a shard's cost does not grow with
the steps before it.

Reported per client: client CPU milliseconds per rollout (user+system of the whole client
process, every thread, measured around the collection only, so interpreter start and imports
are left out), peak RSS (VmHWM), and for the asyncio clients the worst gap of a task that
sleeps 10 ms in a loop (how long the loop stalled).

The machine is shared and noisy: compare ratios within one run, not figures across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
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
from throughput import make_rows  # noqa: E402

AGENT = "bench_agent"
CLIENTS = (
    "cli",
    "trio",
    "trio+shards",
    "aio",
    "aio+shards",
    "aio-guest",
    "trio-asyncio",
    "sync",
    "nemo-gym",
)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def steps(batches: int, rows: int) -> Iterator[list[dict[str, Any]]]:
    """Each step's rows, made when the step starts (task indices restart at 0 every step, as a
    trainer's plan would); only one step's rows are ever held, as the CLI streams its input."""
    for _ in range(batches):
        yield list(make_rows(rows, AGENT))


class Ticker:
    """An asyncio task that sleeps 10 ms in a loop and remembers its longest gap."""

    def __init__(self) -> None:
        self.worst = 0.0
        self.stop = asyncio.Event()

    async def run(self) -> None:
        last = time.monotonic()
        while not self.stop.is_set():
            await asyncio.sleep(0.01)
            now = time.monotonic()
            self.worst = max(self.worst, now - last)
            last = now


# --- clients (each runs in its own subprocess) ---------------------------------------------------


def run_cli(url: str, batches: int, rows: int, concurrency: int, folder: Path) -> dict[str, Any]:
    from trollout.cli.main import cli

    source = folder / "input.jsonl"
    with source.open("w") as f:
        for step in range(batches):
            for row in make_rows(rows, AGENT):  # distinct content per step, like the others
                row["responses_create_params"]["input"][0]["content"] += f" (step {step})"
                f.write(json.dumps(row) + "\n")
    args = ["collect", str(source), "-o", str(folder / "out.jsonl"), "--agent", AGENT]
    args += ["--agent-url", f"{AGENT}={url}", "--concurrency", str(concurrency)]
    args += ["--no-aggregate", "--progress", "plain"]
    cpu0 = cpu_seconds()
    try:
        cli(args, standalone_mode=False)
    except SystemExit as exc:
        if exc.code:
            raise RuntimeError(f"trollout collect exited {exc.code}") from exc
    return {"cpu_s": cpu_seconds() - cpu0, "landed": batches * rows}


def run_trio(
    url: str, batches: int, rows: int, concurrency: int, folder: Path | None, fsync: str = "batch"
) -> dict[str, Any]:
    import trio

    import trollout

    config = trollout.RunConfig(num_samples_in_parallel=concurrency, fsync=fsync)
    work = steps(batches, rows)

    async def main() -> int:
        landed = 0
        async with trollout.open_rollouts(
            {AGENT: url}, config=config, record_output_dir=folder
        ) as ro:
            for step, step_rows in enumerate(work):
                shard = f"step-{step:04d}" if folder is not None else None
                async with ro.open_batch(step_rows, record_shard=shard) as batch:
                    async for item in batch:
                        landed += item.landed
        return landed

    cpu0 = cpu_seconds()
    landed = trio.run(main)
    return {"cpu_s": cpu_seconds() - cpu0, "landed": landed}


def run_aio(
    url: str,
    batches: int,
    rows: int,
    concurrency: int,
    guest: bool,
    folder: Path | None = None,
    fsync: str = "batch",
) -> dict[str, Any]:
    import trollout

    config = trollout.RunConfig(num_samples_in_parallel=concurrency, fsync=fsync)
    work = steps(batches, rows)

    async def main() -> dict[str, Any]:
        ticker = Ticker()
        beat = asyncio.create_task(ticker.run())
        landed = 0
        async with _aio_rollouts(url, config, guest, folder) as ro:
            step = 0
            while step_rows := await asyncio.to_thread(next, work, None):  # off the loop
                shard = f"step-{step:04d}" if folder is not None else None
                step += 1
                async with ro.open_batch(step_rows, record_shard=shard) as batch:
                    async for item in batch:
                        landed += item.landed
        ticker.stop.set()
        await beat
        return {"landed": landed, "worst_gap_ms": ticker.worst * 1000}

    cpu0 = cpu_seconds()
    result = asyncio.run(main())
    return {"cpu_s": cpu_seconds() - cpu0, **result}


def _aio_rollouts(url: str, config: Any, guest: bool, folder: Path | None) -> Any:
    import trollout

    if not guest:
        return trollout.aio.open_rollouts({AGENT: url}, config=config, record_output_dir=folder)
    return _guest_rollouts(url, config)


class _GuestContext:
    """`trollout.aio.open_rollouts`, with Trio in guest mode on this loop instead of a thread."""

    def __init__(self, url: str, config: Any) -> None:
        from trollout.frontends.bridge import RolloutsThread

        self.thread = RolloutsThread({AGENT: url}, config=config)

    async def __aenter__(self) -> Any:
        import trio

        from trollout.frontends.aio import AioRollouts

        loop = asyncio.get_running_loop()
        self.done: asyncio.Future[Any] = loop.create_future()
        trio.lowlevel.start_guest_run(
            self.thread._main,
            run_sync_soon_threadsafe=loop.call_soon_threadsafe,
            done_callback=self.done.set_result,
        )
        while not self.thread._ready.is_set():
            await asyncio.sleep(0.001)
        return AioRollouts(self.thread)

    async def __aexit__(self, *exc: object) -> None:
        self.thread.stop()
        (await self.done).unwrap()


def _guest_rollouts(url: str, config: Any) -> _GuestContext:
    return _GuestContext(url, config)


def run_trio_asyncio(url: str, batches: int, rows: int, concurrency: int) -> dict[str, Any]:
    import trio
    import trio_asyncio

    import trollout

    config = trollout.RunConfig(num_samples_in_parallel=concurrency)
    work = steps(batches, rows)

    async def trainer(ro: Any) -> int:  # asyncio code: the trainer's own loop
        landed = 0
        for step_rows in work:
            items = await trio_asyncio.trio_as_aio(ro.run_batch)(step_rows)
            landed += sum(item.landed for item in items)
        return landed

    async def main() -> int:
        async with (
            trio_asyncio.open_loop(),
            trollout.open_rollouts({AGENT: url}, config=config) as ro,
        ):
            return await trio_asyncio.aio_as_trio(trainer)(ro)  # type: ignore[no-any-return]

    cpu0 = cpu_seconds()
    landed = trio.run(main)
    return {"cpu_s": cpu_seconds() - cpu0, "landed": landed}


def run_sync(url: str, batches: int, rows: int, concurrency: int) -> dict[str, Any]:
    import trollout

    config = trollout.RunConfig(num_samples_in_parallel=concurrency)
    work = steps(batches, rows)
    cpu0 = cpu_seconds()
    landed = 0
    with trollout.sync.open_rollouts({AGENT: url}, config=config) as ro:
        for step_rows in work:
            with ro.open_batch(step_rows) as batch:
                landed += sum(item.landed for item in batch)
    return {"cpu_s": cpu_seconds() - cpu0, "landed": landed}


def run_nemo_gym(url: str, batches: int, rows: int, concurrency: int) -> dict[str, Any]:
    import trollout
    from trollout.nemo_gym import RolloutCollectionHelper

    config = trollout.RunConfig(num_samples_in_parallel=concurrency, agent_urls={AGENT: url})
    helper = RolloutCollectionHelper(config=config)
    work = steps(batches, rows)

    async def main() -> dict[str, Any]:
        ticker = Ticker()
        beat = asyncio.create_task(ticker.run())
        landed = 0
        while step_rows := await asyncio.to_thread(next, work, None):  # off the loop
            completions = helper.run_examples(step_rows, retry_requests=False)
            for future in completions:
                _, result = await future
                landed += "reward" in result
        ticker.stop.set()
        await beat
        return {"landed": landed, "worst_gap_ms": ticker.worst * 1000}

    cpu0 = cpu_seconds()
    result = asyncio.run(main())
    return {"cpu_s": cpu_seconds() - cpu0, **result}


def client_main(argv: list[str]) -> None:
    kind, url, batches_s, rows_s, concurrency_s, folder_s, fsync = argv
    batches, rows, concurrency, folder = (
        int(batches_s),
        int(rows_s),
        int(concurrency_s),
        Path(folder_s),
    )
    if kind == "cli":
        result = run_cli(url, batches, rows, concurrency, folder)
    elif kind in ("trio", "trio+shards"):
        result = run_trio(
            url, batches, rows, concurrency, folder if kind == "trio+shards" else None, fsync
        )
    elif kind in ("aio", "aio-guest", "aio+shards"):
        result = run_aio(
            url,
            batches,
            rows,
            concurrency,
            guest=kind == "aio-guest",
            folder=folder if kind == "aio+shards" else None,
            fsync=fsync,
        )
    elif kind == "trio-asyncio":
        result = run_trio_asyncio(url, batches, rows, concurrency)
    elif kind == "nemo-gym":
        result = run_nemo_gym(url, batches, rows, concurrency)
    else:
        result = run_sync(url, batches, rows, concurrency)
    result["peak_rss_mib"] = peak_rss_mib()
    print(json.dumps(result))


# --- orchestration -------------------------------------------------------------------------------


def run_client(kind: str, url: str, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="trollout-bench-") as folder:
        if kind.endswith("+shards"):
            prior_shards(Path(folder), args.prior_shards)
        command = [sys.executable, __file__, "--client", kind, url]
        command += [str(args.batches), str(args.rows), str(args.concurrency), folder, args.fsync]
        proc = subprocess.run(command, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} client failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def prior_shards(folder: Path, steps: int) -> None:
    """Fill ``folder`` with the files of ``steps`` earlier shards (empty: only names matter)."""
    endings = (".jsonl", ".lock", "_attempts.jsonl", "_batch_status.json", "_manifest.json")
    for step in range(steps):
        for ending in (*endings, "_materialized_inputs.jsonl"):
            (folder / f"rollouts-earlier-{step:06d}{ending}").touch()


def report(kind: str, n: int, r: dict[str, Any]) -> str:
    gap = f"  worst 10 ms-tick gap {r['worst_gap_ms']:.1f} ms" if "worst_gap_ms" in r else ""
    return (
        f"{kind:13s} {r['landed']:>7d}/{n:<7d} {1000 * r['cpu_s'] / n:7.3f} CPU ms/rollout  "
        f"peak RSS {r['peak_rss_mib']:5.0f} MiB{gap}"
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        client_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--clients", default=",".join(CLIENTS))
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--prior-shards", type=int, default=0, metavar="N")
    parser.add_argument("--fsync", default="batch", choices=("row", "batch", "never"))
    args = parser.parse_args()
    from trollout.testing import AgentSpec, DeploymentSpec, spawn_fake_deployment

    spec = DeploymentSpec(agents=(AgentSpec(name=AGENT),), record_runs=False)
    n = args.batches * args.rows
    print(f"{n} rollouts ({args.batches} batches of {args.rows}), {args.concurrency} in flight")
    if args.prior_shards:
        print(f"shard folders start with {args.prior_shards} earlier steps' files")
    with spawn_fake_deployment(spec, record_runs=False) as fake:
        url = fake.run_urls[AGENT]
        for _ in range(args.repeat):
            for kind in args.clients.split(","):
                print(report(kind, n, run_client(kind, url, args)), flush=True)


if __name__ == "__main__":
    main()
