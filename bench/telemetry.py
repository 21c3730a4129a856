"""What telemetry costs the hot path: client CPU per rollout, off / traces / metrics / both.

    .venv/bin/python bench/telemetry.py [--rollouts 20000] [--concurrency 64,512] [--rounds 3]

Each client is bench/throughput.py's ``trollout`` client (the real engine writing a real run
folder) in a fresh subprocess against one fake deployment (zero latency, no faults), run
side by side in this one invocation, the modes interleaved round by round so that the shared
machine's noise falls on all of them alike:

- ``off``: nothing configured (no OpenTelemetry module is even imported);
- ``traces``: a job span and one span per attempt, exported by the SDK's BatchSpanProcessor
  to a null exporter (the export itself is not what is measured), ``traceparent`` on every POST;
- ``metrics``: every instrument, served on a Prometheus endpoint (127.0.0.1, a free port,
  never scraped during the run);
- ``both``: the two together.

Reported per mode: the median over rounds of client CPU ms per rollout (user+system CPU of the
client process around the collection only: opening telemetry and its final flush included,
importing OpenTelemetry not), and rollouts/s.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from throughput import cpu_seconds, write_materialized  # noqa: E402

MODES = ("off", "traces", "metrics", "both")


def run_client(mode: str, url: str, rows_path: Path, out: Path, concurrency: int) -> dict[str, Any]:
    import trio

    from trollout import jsonl
    from trollout.collector.engine.collector import open_collector
    from trollout.records import MaterializedRow
    from trollout.recovery.layout import RunLayout
    from trollout.recovery.store import open_run_store
    from trollout.settings import RunConfig

    config = RunConfig(num_samples_in_parallel=concurrency, output_jsonl_fpath=str(out))
    n = sum(1 for _ in rows_path.open())

    async def main() -> dict[str, Any]:
        layout = RunLayout.for_output(out)
        rows = (MaterializedRow.from_body(r) for r in jsonl.read_rows(rows_path))
        if mode != "off":  # a run imports these once: not a per-rollout cost
            import opentelemetry.sdk.trace.export  # noqa: F401

            import trollout.telemetry.runtime  # noqa: F401
        async with open_run_store(layout, config, expected=n, fresh=True) as store:
            cpu0, t0 = cpu_seconds(), time.perf_counter()
            if mode == "off":
                async with open_collector(
                    config=config, urls={"bench_agent": url}, sink=store
                ) as c:
                    progress = await c.collect(rows)
            else:
                progress = await _observed(mode, config, url, store, rows, n)
            cpu1, t1 = cpu_seconds(), time.perf_counter()
        loaded = any(m.startswith("opentelemetry") for m in sys.modules)
        return {
            "n": n,
            "landed": progress.landed,
            "cpu_s": cpu1 - cpu0,
            "wall_s": t1 - t0,
            "otel_loaded": loaded,
        }

    return trio.run(main)  # type: ignore[no-any-return]


async def _observed(mode: str, config: Any, url: str, store: Any, rows: Any, n: int) -> Any:
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from trollout.collector.engine.collector import open_collector
    from trollout.telemetry import TelemetrySettings
    from trollout.telemetry.runtime import open_telemetry

    class NullExporter(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    traces = mode in ("traces", "both")
    prometheus = ("127.0.0.1", 0) if mode in ("metrics", "both") else None
    settings = TelemetrySettings(prometheus=prometheus)
    exporter = NullExporter() if traces else None
    stream = io.StringIO()  # the endpoint's URL line
    async with (
        open_telemetry(settings, max_attempts=3, span_exporter=exporter, stream=stream) as t,
        open_collector(config=config, urls={"bench_agent": url}, sink=store, observer=t) as c,
    ):
        t.watch(c, expected=n)
        return await c.collect(rows)


def spawn(mode: str, url: str, rows: Path, out: Path, concurrency: int) -> dict[str, Any]:
    command = [
        sys.executable,
        __file__,
        "--client",
        mode,
        url,
        str(rows),
        str(out),
        str(concurrency),
    ]
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} client failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        mode, url, rows, out, concurrency = sys.argv[2:]
        print(json.dumps(run_client(mode, url, Path(rows), Path(out), int(concurrency))))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=20000)
    parser.add_argument("--concurrency", default="64,512")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from trollout.testing import DeploymentSpec, spawn_fake_deployment

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        rows = folder / "rows.jsonl"
        write_materialized(rows, args.rollouts, "bench_agent")
        spec = DeploymentSpec.for_benchmark(agents=["bench_agent"], latency_s=0.0)
        with spawn_fake_deployment(spec) as fake:
            url = fake.run_urls["bench_agent"]
            print(f"fake deployment pid {fake.pid}; {args.rollouts} rollouts per run")
            for concurrency in [int(c) for c in args.concurrency.split(",")]:
                results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
                for round_ in range(args.rounds):
                    for mode in MODES:
                        out = folder / f"{mode}_{concurrency}_{round_}.jsonl"
                        results[mode].append(spawn(mode, url, rows, out, concurrency))
                for mode in MODES:
                    print(line(mode, concurrency, results[mode]), flush=True)


def line(mode: str, concurrency: int, runs: list[dict[str, Any]]) -> str:
    per = [1000 * r["cpu_s"] / r["n"] for r in runs]
    rate = statistics.median(r["landed"] / r["wall_s"] for r in runs)
    spread = ", ".join(f"{x:.3f}" for x in per)
    loaded = "otel loaded" if runs[0]["otel_loaded"] else "otel not loaded"
    return (
        f"{mode:8s} c={concurrency:<5d} {statistics.median(per):6.3f} CPU ms/rollout "
        f"(runs: {spread}) {rate:8.0f} rollouts/s  [{loaded}]"
    )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
