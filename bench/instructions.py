"""Instructions per rollout, counted by valgrind: a CPU figure the shared machine cannot blur.

    .venv/bin/python bench/instructions.py [--sizes 1000,3000] [--compare-src OTHER/src]
        [--stages plan,materialize,read-back,engine,collect]

CPU seconds on this 2-core machine swing by 10-20 % from one minute to the next (other tenants),
so a change worth 2 % cannot be seen in them, however often the runs alternate. The number of
instructions a process executes does not depend on the neighbours: each stage below runs in a
child under ``valgrind --tool=callgrind`` twice, with two input sizes, and the difference
divided by the difference in rollouts is the stage's marginal instructions per rollout
(start-up and imports cancel). Instructions are not time (a syscall, a cache miss or a page
fault costs far more than its instruction count), so use this to compare code, and
bench/collect_cpu.py for what a user pays. Work driven by the clock (the store's fsync every
second, the status file every two) runs more often per rollout under valgrind, which is about
50 times slower: figures that include the store carry a little of it.

Stages, each including the ones before where it says so:

- ``plan``: `plan_rollouts` of an input of N rows (the checking pass, and the counting pass
  when a selection drops rows);
- ``materialize``: plan, then the materialized-inputs file written (`files.write_materialized`);
- ``read-back``: all of that, then the rows read back as a fresh run dispatches them;
- ``engine``: `open_collector` over materialized rows read from a file, writing a `RunStore`,
  with a transport that answers every POST at its next checkpoint with the fake deployment's
  reply (no sockets: pool, dispatch, classification, writer, store);
- ``collect``: the whole ``trollout collect`` command against the fake deployment (real
  sockets; the number of event-loop turns per rollout depends on timing, so this one varies a
  little from run to run).

Needs valgrind (Debian: ``apt-get install valgrind``).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
AGENT = "bench_agent"
REPLY = {
    "responses_create_params": {"input": [{"role": "user", "content": "What is 1 + 1?"}]},
    "response": {
        "id": "resp_0",
        "output": [{"content": [{"text": "2", "type": "output_text"}], "role": "assistant"}],
        "usage": {"input_tokens": 18, "output_tokens": 4, "total_tokens": 22},
    },
    "reward": 1.0,
}
HEADERS = [(b"content-type", b"application/json")]
STAGES = ("plan", "materialize", "read-back", "engine", "collect")


# --- the children -------------------------------------------------------------------------------


def child(stage: str, folder: Path, n: int, head_port: int) -> None:
    """Run one stage over ``folder/in<n>.jsonl`` (in this process, under valgrind)."""
    import threading

    import trio

    from trollout.collector.deployment.discovery import Deployment
    from trollout.collector.planning.plan import plan_rollouts
    from trollout.recovery import run_folder
    from trollout.recovery.files import write_materialized
    from trollout.recovery.layout import RunLayout
    from trollout.settings import RunConfig

    source = folder / f"in{n}.jsonl"
    out = folder / f"{stage}{n}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    if stage == "collect":
        from trollout.cli.main import main as cli_main

        sys.argv = [
            "trollout", "collect", str(source), "-o", str(out / "r.jsonl"),
            f"+head_server={{host:127.0.0.1,port:{head_port}}}", f"+agent_name={AGENT}",
            "+num_samples_in_parallel=64", "+disable_aggregation=true",
        ]  # fmt: skip
        try:
            cli_main()
        except SystemExit as exc:
            if exc.code:
                raise
        return
    if stage == "engine":
        trio.run(_engine, folder / f"materialized{n}.jsonl", out / "r.jsonl", n)
        return
    deployment = Deployment.from_agent_urls({AGENT: "http://127.0.0.1:1"})
    config = RunConfig(
        input_jsonl_fpath=str(source), output_jsonl_fpath=str(out / "r.jsonl"), agent_name=AGENT
    )
    plan = plan_rollouts(source, config, deployment)
    if stage == "plan":
        return
    layout = RunLayout.for_output(out / "r.jsonl")
    stamp = run_folder._stamp(str(source))
    rows = run_folder._checked_rows(plan, str(source), stamp)
    write_materialized(layout.materialized_inputs, rows, stop=threading.Event())
    if stage == "read-back":
        for _ in _read_back(layout.materialized_inputs):
            pass


def _read_back(path: Path) -> Any:
    """The rows a fresh run dispatches, read as this checkout's run folder reads them."""
    from trollout import jsonl
    from trollout.records import MaterializedRow

    servers = {AGENT: "policy_model"}
    for number, line in jsonl.iter_lines(path):
        body = jsonl.parse_line(path, number, line)
        try:
            yield MaterializedRow.from_body(body, line, servers)
        except TypeError:  # a checkout from before rows carried their model server
            yield MaterializedRow.from_body(body, line)


async def _engine(rows_path: Path, out: Path, n: int) -> None:
    import orjson
    import trio

    from trollout.collector.engine.collector import open_collector
    from trollout.collector.http.transport import RawResponse
    from trollout.recovery.layout import RunLayout
    from trollout.recovery.store import open_run_store
    from trollout.settings import RunConfig

    class Answering:
        """Answers every POST at its next checkpoint with the reply, echoing the request's
        ``responses_create_params`` as a NeMo Gym agent does (a reply echoing another input
        is a foreign reply, identity_mismatch)."""

        async def post(self, url: str, body: bytes, *, headers: bytes = b"") -> RawResponse:
            await trio.lowlevel.checkpoint()
            echo = orjson.loads(body)["responses_create_params"]
            reply = orjson.dumps({**REPLY, "responses_create_params": echo})
            return RawResponse(200, list(HEADERS), reply, False, url)

        async def aclose(self) -> None:
            pass

    config = RunConfig(num_samples_in_parallel=64, output_jsonl_fpath=str(out))
    layout = RunLayout.for_output(out)
    servers = {AGENT: "policy_model"}
    async with (
        open_run_store(layout, config, expected=n, fresh=True) as store,
        open_collector(
            config=config,
            urls={AGENT: "http://127.0.0.1:1"},
            sink=store,
            transport=Answering(),
            policy_model_servers=servers,
        ) as collector,
    ):
        await collector.collect(_read_back(rows_path))


# --- the parent ---------------------------------------------------------------------------------


def count(src: Path, stage: str, folder: Path, n: int, head_port: int) -> int:
    """Return the instructions one child executes (callgrind's total)."""
    out = folder / f"callgrind.{stage}.{n}"
    command = [
        "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
        sys.executable, __file__, "--child", stage, str(folder), str(n), str(head_port),
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(src), PYTHONHASHSEED="0")
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"{stage} ({n} rows) failed under valgrind:\n{done.stderr[-3000:]}")
    out.unlink(missing_ok=True)
    return int(found.group(1))


def write_inputs(folder: Path, sizes: tuple[int, int]) -> None:
    """The raw input and its materialized rows, as bench/collect_cpu.py writes them."""
    sys.path.insert(0, str(HERE))
    import throughput
    from collect_cpu import write_input

    for n in sizes:
        write_input(folder / f"in{n}.jsonl", n)
        throughput.write_materialized(folder / f"materialized{n}.jsonl", n, AGENT)


def main() -> None:
    """Parse the options and print each stage's marginal instructions per rollout."""
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        stage, folder, n, port = sys.argv[2:6]
        child(stage, Path(folder), int(n), int(port))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,3000", help="small,large input rows")
    parser.add_argument("--stages", default=",".join(STAGES))
    parser.add_argument("--src", default=str(SRC), help="the src folder measured as 'now'")
    parser.add_argument("--compare-src", help="also count trollout imported from this src folder")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("bench/instructions.py needs valgrind (Debian: apt-get install valgrind)")
    small, large = (int(s) for s in args.sizes.split(","))
    stages = [s for s in args.stages.split(",") if s]
    unknown = sorted(set(stages) - set(STAGES))
    if unknown:
        sys.exit(f"unknown stages {unknown}; choose from {', '.join(STAGES)}")
    variants = {"now": Path(args.src).resolve()}
    if args.compare_src:
        variants["before"] = Path(args.compare_src).resolve()
    from collect_cpu import SPEC  # the one-agent 0.7.0 deployment both benches use
    from trollout.testing import spawn_fake_deployment

    with tempfile.TemporaryDirectory(prefix="trollout-instructions-") as tmp:
        folder = Path(tmp)
        write_inputs(folder, (small, large))
        (folder / "spec.yaml").write_text(SPEC)
        with spawn_fake_deployment(folder / "spec.yaml", sleep_s=0.0, record_runs=False) as fake:
            port = fake.ports["head_server"]
            print(f"marginal instructions per rollout ({small} and {large} rows), by valgrind")
            for stage in stages:
                for name, src in variants.items():
                    a = count(src, stage, folder, small, port)
                    b = count(src, stage, folder, large, port)
                    per = (b - a) / (large - small)
                    print(f"  {stage:12s} {name:6s} {per:12,.0f}", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main()
