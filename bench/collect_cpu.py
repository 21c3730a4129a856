"""Marginal CPU per rollout of the real ``trollout collect`` command, end to end.

    .venv/bin/python bench/collect_cpu.py [--sizes 200,20000] [--concurrency 1,64,512,4096]
        [--repeats 3] [--src SRC] [--compare-src OTHER_CHECKOUT/src] [--no-engine] [--no-profile]
        [--no-memory] [--no-table]

What users pay is the whole command: start-up, planning, the materialized inputs written and
read back, the attempt ledger, the status file, progress, classification and the writer, not
only the engine. So this runs ``trollout collect`` itself, as a child process, against the
project's fake deployment (``python -m trollout.testing serve --spec SPEC --sleep 0
--no-record-runs``: one 0.7.0-shaped agent, no latency, no faults, in its own process) with
``+num_samples_in_parallel=K +disable_aggregation=true`` into a fresh run folder, and reads the
child's CPU (user + system, from ``os.wait4``) and its peak RSS (VmHWM, which the child reports
at exit: ``ru_maxrss`` would carry the parent's peak over fork and exec).

For each concurrency K, the marginal CPU per rollout is ``(CPU(large) - CPU(small)) /
(large - small)``, which cancels start-up and planning constants; the start-up CPU is what is
left of CPU(small) once its rollouts are taken out. Runs alternate (small, large, and with
``--compare-src`` the other checkout's code right after ours), ``--repeats`` times, and the
medians are printed: the machine is shared, so compare within one run, not across runs.

Beside it: the engine-only figure (bench/throughput.py's client: `open_collector` and a
`RunStore` over materialized rows, no CLI), peak RSS with 10,000 rollouts in flight (the fake
sleeps 5 s per ``/run``), and a profile by layer: the command run under cProfile at the
``--profile-concurrency`` for both sizes, each function's own time attributed to a layer of
trollout (a builtin or a library function to the layer of trollout or Trio that called it), and
the layer's marginal share printed in ms of CPU per rollout (cProfile, timed by the process's CPU
clock, inflates every figure; the shares are what it is for).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
AGENT = "bench_agent"  # throughput.py's rows name this agent: one fake serves both benches
SPEC = f'generation: "0.7.0"\nagents:\n  - name: {AGENT}\n'
_PEAK_ENV = "TROLLOUT_BENCH_PEAK_FILE"


# --- the child: the real CLI, reporting its own peak RSS ---------------------------------------


def child_main(argv: list[str]) -> None:
    """Run ``trollout <argv>`` in this process (optionally profiled); note VmHWM at exit."""
    profile_out = None
    if argv[:1] == ["--profile"]:
        profile_out, argv = argv[1], argv[2:]
    sys.argv = ["trollout", *argv]
    from trollout.cli.main import main as trollout_main

    # CPU time, not wall time: on a shared machine the wall clock also counts time preempted.
    profiler = cProfile.Profile(time.process_time) if profile_out else None
    try:
        if profiler is not None:
            profiler.enable()
        trollout_main()
    finally:
        if profiler is not None and profile_out is not None:
            profiler.disable()
            profiler.dump_stats(profile_out)
        _write_peak()


def _write_peak() -> None:
    path = os.environ.get(_PEAK_ENV)
    if path:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                Path(path).write_text(line.split()[1])


# --- running one collect ------------------------------------------------------------------------


def write_input(path: Path, n: int) -> None:
    """Write `n` raw (unplanned) arithmetic rows, the shape of fixtures/example_tasks.jsonl."""
    with path.open("w") as f:
        for i in range(n):
            prompt = {"input": [{"role": "user", "content": f"What is {i} + {i % 97}?"}]}
            row = {"responses_create_params": prompt, "expected_answer": str(i + i % 97)}
            f.write(json.dumps(row) + "\n")


def run_collect(
    src: Path,
    rows: Path,
    out_dir: Path,
    head_port: int,
    concurrency: int,
    *,
    profile_out: Path | None = None,
) -> dict[str, float]:
    """Run ``trollout collect`` in a child; return its CPU seconds, peak RSS MiB and wall time."""
    out = out_dir / "r.jsonl"
    peak = out_dir / "peak_kib"
    out_dir.mkdir(parents=True)
    profile = ["--profile", str(profile_out)] if profile_out is not None else []
    command = [
        sys.executable,
        __file__,
        "--child",
        *profile,
        "collect",
        str(rows),
        "-o",
        str(out),
        f"+head_server={{host:127.0.0.1,port:{head_port}}}",
        f"+agent_name={AGENT}",
        f"+num_samples_in_parallel={concurrency}",
        "+disable_aggregation=true",
    ]
    env = dict(os.environ, PYTHONPATH=str(src), **{_PEAK_ENV: str(peak)})
    with (out_dir / "stderr").open("w") as stderr:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr, env=env
        )
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    landed = sum(1 for _ in out.open()) if out.exists() else 0
    expected = sum(1 for _ in rows.open())
    if proc.returncode != 0 or landed != expected:
        tail = (out_dir / "stderr").read_text()[-3000:]
        raise RuntimeError(f"collect exited {proc.returncode}, {landed}/{expected} landed:\n{tail}")
    return {
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "rss_mib": int(peak.read_text()) / 1024,
        "wall_s": wall,
    }


# --- the fake deployment ------------------------------------------------------------------------


@contextmanager
def fake(folder: Path, sleep_s: float) -> Iterator[Any]:
    """Serve the one-agent 0.7.0 spec in a subprocess (`spawn_fake_deployment`)."""
    from trollout.testing import spawn_fake_deployment

    folder.mkdir(parents=True, exist_ok=True)
    spec = folder / "spec.yaml"
    spec.write_text(SPEC)
    with spawn_fake_deployment(spec, sleep_s=sleep_s, record_runs=False) as urls:
        yield urls


# --- the measurements ---------------------------------------------------------------------------


def marginal_table(args: argparse.Namespace, folder: Path, urls: Any) -> None:
    """Print, per concurrency and variant, the medians of marginal CPU, start-up CPU and RSS."""
    small, large = (int(s) for s in args.sizes.split(","))
    inputs = {}
    for n in (small, large):
        inputs[n] = folder / f"in{n}.jsonl"
        write_input(inputs[n], n)
    variants = _variants(args)
    head_port = urls.ports["head_server"]
    print(
        f"trollout collect, {small} and {large} rows, medians of {args.repeats} alternated runs; "
        "marginal = (CPU(large) - CPU(small)) / (large - small)",
        flush=True,
    )
    run = 0
    for k in (int(c) for c in args.concurrency.split(",")):
        results: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
        for _ in range(args.repeats):
            for name, src in variants.items():
                got = {}
                for n in (small, large):
                    run += 1
                    got[n] = run_collect(src, inputs[n], folder / f"c{run}", head_port, k)
                marginal = (got[large]["cpu_s"] - got[small]["cpu_s"]) / (large - small)
                results[name].append(
                    {
                        "marginal_ms": 1000 * marginal,
                        "startup_s": got[small]["cpu_s"] - small * marginal,
                        "rss_small": got[small]["rss_mib"],
                        "rss_large": got[large]["rss_mib"],
                        "rate": large / got[large]["wall_s"],
                    }
                )
        for name, rs in results.items():
            print(_row(name, k, rs), flush=True)
        if not args.no_engine:
            engine_only(args, folder, urls, variants, k, large)


def _variants(args: argparse.Namespace) -> dict[str, Path]:
    variants = {"now": Path(args.src).resolve()}
    if args.compare_src:
        variants["before"] = Path(args.compare_src).resolve()
    return variants


def _row(name: str, k: int, rs: list[dict[str, float]]) -> str:
    def med(key: str) -> float:
        return statistics.median(r[key] for r in rs)

    spread = ", ".join(f"{r['marginal_ms']:.3f}" for r in rs)
    return (
        f"  {name:6s} K={k:<5d} marginal {med('marginal_ms'):.3f} ms/rollout ({spread})  "
        f"start-up {med('startup_s'):.2f} s CPU  peak RSS {med('rss_small'):.0f} / "
        f"{med('rss_large'):.0f} MiB (small / large)  {med('rate'):.0f} rollouts/s"
    )


def engine_only(
    args: argparse.Namespace,
    folder: Path,
    urls: Any,
    variants: dict[str, Path],
    k: int,
    n: int,
) -> None:
    """Print bench/throughput.py's engine-only CPU per rollout (one run per variant)."""
    sys.path.insert(0, str(HERE))
    import throughput

    rows = folder / f"materialized{n}.jsonl"
    if not rows.exists():
        throughput.write_materialized(rows, n, AGENT)
    for name, src in variants.items():
        out = folder / f"engine_{name}_{k}.jsonl"
        r = throughput.run_client("before", urls.run_urls[AGENT], rows, out, k, str(src))
        print(
            f"  {name:6s} K={k:<5d} engine only (bench/throughput.py): "
            f"{1000 * r['cpu_s'] / r['n']:.3f} ms/rollout, peak RSS {r['peak_rss_mib']:.0f} MiB",
            flush=True,
        )


def memory_in_flight(args: argparse.Namespace, folder: Path) -> None:
    """Print peak RSS of ``trollout collect`` with 10,000 rollouts in flight (5 s per /run)."""
    n = 10000
    rows = folder / f"inflight{n}.jsonl"
    write_input(rows, n)
    variants = _variants(args)
    with fake(folder / "sleepy", 5.0) as urls:
        for name, src in variants.items():
            out = folder / f"inflight_{name}"
            r = run_collect(src, rows, out, urls.ports["head_server"], n)
            print(
                f"  {name:6s} {n} in flight (the fake sleeps 5 s): peak RSS "
                f"{r['rss_mib']:.0f} MiB, {r['cpu_s']:.2f} s CPU",
                flush=True,
            )


# --- the profile by layer -----------------------------------------------------------------------

_LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "transport/http11",
        tuple(
            f"trollout/collector/{m}.py"
            for m in ("transport", "http11", "exchange", "replies", "codings")
        ),
    ),
    ("dispatch", ("trollout/collector/dispatch.py", "trollout/collector/retry.py")),
    ("classify", ("trollout/collector/classify.py", "trollout/collector/episodes.py")),
    (
        "engine",
        tuple(
            f"trollout/collector/{m}.py"
            for m in ("engine", "pool", "window", "timing", "stops", "sink", "batch")
        ),
    ),
    ("store/writer", ("trollout/recovery/", "trollout/jsonl.py")),
    ("progress", ("trollout/collector/progress.py", "trollout/cli/progress.py", "/rich/")),
    ("records", ("trollout/records.py", "/cattrs/", "/attr/", "/attrs/")),
    ("cli/planning", ("trollout/",)),
    ("trio scheduling", ("/trio/", "/outcome/", "/sortedcontainers/")),
    ("imports", ("<frozen importlib", "<frozen zipimport")),
]


def _layer_of_file(filename: str) -> str | None:
    for layer, needles in _LAYERS:
        if any(needle in filename for needle in needles):
            return layer
    return None


def layer_times(profile: Path) -> dict[str, float]:
    """Return own time per layer; unclassified functions go to their main caller's layer."""
    stats: dict[Any, Any] = pstats.Stats(str(profile)).stats  # type: ignore[attr-defined]
    memo: dict[Any, str] = {}

    def layer(func: Any, seen: frozenset[Any] = frozenset()) -> str:
        if func in memo:
            return memo[func]
        found = _layer_of_file(func[0])
        if found is None:
            callers = stats.get(func, (0, 0, 0, 0, {}))[4]
            ranked = sorted(callers.items(), key=lambda item: -item[1][2])
            nxt = next((c for c, _ in ranked if c not in seen), None)
            found = "other" if nxt is None else layer(nxt, seen | {func})
        memo[func] = found
        return found

    totals: dict[str, float] = {}
    for func, (_, _, own, _, callers) in stats.items():
        if _layer_of_file(func[0]) is None and callers:
            # A builtin or library call: split its own time over its callers' layers.
            for caller, edge in callers.items():
                name = layer(caller, frozenset({func}))
                totals[name] = totals.get(name, 0.0) + edge[2]
        else:
            name = layer(func)
            totals[name] = totals.get(name, 0.0) + own
    return totals


def profile_by_layer(args: argparse.Namespace, folder: Path, urls: Any) -> None:
    """Print where the marginal time goes, by layer, from cProfile runs of both sizes."""
    small, large = (int(s) for s in args.sizes.split(","))
    for n in (small, large):
        if not (folder / f"in{n}.jsonl").exists():
            write_input(folder / f"in{n}.jsonl", n)
    k = args.profile_concurrency
    times = {}
    for n in (small, large):
        prof = folder / f"profile{n}.prof"
        run_collect(
            Path(args.src),
            folder / f"in{n}.jsonl",
            folder / f"profiled{n}",
            urls.ports["head_server"],
            k,
            profile_out=prof,
        )
        times[n] = layer_times(prof)
    names = set(times[small]) | set(times[large])
    marginal = {
        x: (times[large].get(x, 0) - times[small].get(x, 0)) / (large - small) for x in names
    }
    layers = sorted(names, key=lambda x: -marginal[x])
    total = sum(marginal.values())
    print(f"profile by layer (cProfile, K={k}; marginal per rollout, inflated by the profiler):")
    for x in layers:
        share = 100 * marginal[x] / total if total else 0.0
        print(
            f"  {x:18s} {1000 * marginal[x]:7.3f} ms/rollout {share:5.1f} %   "
            f"start-up and planning {times[small].get(x, 0) - small * marginal[x]:6.2f} s"
        )
    print(f"  {'total':18s} {1000 * total:7.3f} ms/rollout", flush=True)


def main() -> None:
    """Parse the options, start the fake and print every figure."""
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="200,20000", help="small,large input rows")
    parser.add_argument("--concurrency", default="1,64,512,4096")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--src", default=str(SRC), help="the src folder measured as 'now'")
    parser.add_argument("--compare-src", help="also run trollout imported from this src folder")
    parser.add_argument("--profile-concurrency", type=int, default=64)
    parser.add_argument("--no-engine", action="store_true", help="skip the engine-only figure")
    parser.add_argument("--no-profile", action="store_true", help="skip the profile by layer")
    parser.add_argument("--no-memory", action="store_true", help="skip 10,000 in flight")
    parser.add_argument("--no-table", action="store_true", help="skip the marginal CPU table")
    args = parser.parse_args()
    steps: list[Callable[[Path, Any], None]] = []
    if not args.no_table:
        steps.append(lambda f, u: marginal_table(args, f, u))
    if not args.no_profile:
        steps.append(lambda f, u: profile_by_layer(args, f, u))
    with tempfile.TemporaryDirectory(prefix="trollout-collect-cpu-") as tmp:
        folder = Path(tmp)
        with fake(folder, 0.0) as urls:
            print(f"fake deployment: head {urls.head_url}, pid {urls.pid}", flush=True)
            for step in steps:
                step(folder, urls)
        if not args.no_memory:
            memory_in_flight(args, folder)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
