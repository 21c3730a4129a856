"""The four "bad days" of issue 21, measured through the real ``trollout collect`` command.

    .venv/bin/python bench/retry_days.py [--cases dead,429,polite,mixed] [--repeats 1]
        [--src SRC] [--compare-src OTHER_CHECKOUT/src] [--timeout 420]

What a user sees on a bad day is the whole command: how long it runs, how it exits, what lands,
what fails and why, and what the deployment had to take meanwhile. So, as bench/collect_cpu.py
does, this runs ``trollout collect`` itself in a child process (``PYTHONPATH=SRC``, the code
under test), with ``--agent-url bench_agent=URL --agent bench_agent --no-aggregate
--progress plain +num_samples_in_parallel=K`` into a fresh run folder, one run per case. The
cases are the rows of `CASES` (one table: change a case there, nowhere else):

- ``dead``: 40 rollouts (10 tasks x 4 repeats) at 8 in flight against a port that refuses
  connections (a socket bound to 127.0.0.1:0, its port read, the socket closed);
- ``429``: 40 rollouts at 8 in flight; every request is answered 429 with no Retry-After;
- ``polite``: 16 rollouts; requests 0 and 1 of attempt 0 are answered 429 with
  ``Retry-After: 0.05``, then 200;
- ``mixed``: 20 tasks x 3 repeats at 8 in flight, replies in 2-10 ms, 10 % of requests 503,
  15 % 500, 10 % reset after the request was read, 10 % a 200 whose body is not JSON.

The deployment is the project's fake (`trollout.testing`), in its own process, always imported
from *this* checkout's src, whichever src the command runs from, so the server side is the same
for both variants. It is started through `serve_until_signal` with a fault hook of this file
(`RecordingHook`): the hook sees every ``/run`` with its (task, rollout, attempt, request index
within the attempt), appends one line per request to a log (``time.monotonic()``, the same
clock as ours, and the fault applied) and returns the request's fault: from a fault script
(`FaultScript`, the ``polite`` case) or from a `FaultPlan` drawn per request (a plan keyed by the
request index as well; ``429`` and ``mixed``). The spec itself has no faults, so a request the
hook spares is answered normally. A fresh fake per run, so the log belongs to that run alone.

Per run it reads: the wall time until the command exits (a run still going after ``--timeout``
gets SIGTERM, then SIGKILL 60 s later, and is shown as ``>T`` with how many rollouts had settled
at T), its CPU (``os.wait4``) and exit code; from the run folder, rollouts landed (lines of the
rollouts file) and failed by ``class/kind`` (the latest failure row of each rollout that did not
land, from the failures sidecar), not settled = expected - landed - failed; from the command's
stdout, the dispatch time (``run timing report: X since dispatch began``) and the retry line
(``retries N (waited X s)`` ...; else the last progress line's); from the fake's log, requests
per rollout (max and mean over the rollouts of the plan) and the longest gap between two
consecutive requests (every gap is one in which some rollout was pending: the one of the later
request), with the gap from the last request to the exit beside it. The dead endpoint has no
log (nothing listens): its request figures are ``-``. A timed-out run's outcomes, dispatch time
and retry line are what it wrote by its exit after the SIGTERM (rollouts still waiting then
fail or are omitted during trollout's stop), beside the count settled at the timeout itself.

With ``--compare-src`` each case runs with our src, then right after with the other's,
alternating, ``--repeats`` times; numbers are medians (every run's wall time is listed), exit
codes and failure kinds are listed per run when they differ. Nothing is asserted: the figures are
for reading side by side, and the machine is shared, so compare within one run of this script.

Rejected: a `FaultPlan` in the spec for ``429`` and ``mixed``. A plan draws per (task, rollout,
attempt), so every re-send within an attempt meets the first request's fault: a 503 would be a
503 forever for that rollout, not "10 % of requests". And an in-process fake (``fake.stats``):
it would share this process with nothing to measure, but the command under test must be a
child (its own src, its own exit code), and the fake's arrival times need a clock shared with
the parent, which ``time.monotonic()`` across processes gives.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import select
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import orjson

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"  # the fake is always this checkout's
AGENT = "bench_agent"
SPEC = f'generation: "0.7.0"\nagents:\n  - name: {AGENT}\n'
KILL_GRACE_S = 60.0  # after the SIGTERM of a timed-out run (trollout's own grace is 30 s)
MS_REPLIES = {"fixed_s": 0.002, "jitter_s": 0.008}  # latency of the fake's /run: 2-10 ms


# --- the cases ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One bad day.

    Attributes:
        name: what ``--cases`` calls it.
        title: one line for the table.
        tasks: task rows in the input.
        repeats: rollouts per task (``--num-repeats``).
        in_flight: ``+num_samples_in_parallel``.
        dead: the agent URL is a port that refuses connections (no fake at all).
        latency: the fake's ``/run`` latency (a `Latency` mapping).
        plan: a `FaultPlan` mapping (``plan_from_dict``'s shape), drawn per request.
        script: ``(attempt, request, fault mapping)`` for every rollout: a fault script.
        args: more arguments for ``trollout collect``.
    """

    name: str
    title: str
    tasks: int
    repeats: int = 1
    in_flight: int = 8
    dead: bool = False
    latency: Mapping[str, float] = field(default_factory=lambda: MS_REPLIES)
    plan: Mapping[str, Any] | None = None
    script: tuple[tuple[int, int, Mapping[str, Any]], ...] = ()
    args: tuple[str, ...] = ()

    @property
    def rollouts(self) -> int:
        """Return how many rollouts the case plans."""
        return self.tasks * self.repeats


_429 = {"kind": "status", "status": 429}
CASES: tuple[Case, ...] = (
    Case(
        name="dead",
        title="dead endpoint: 40 rollouts (10 tasks x 4) at 8 in flight, the port refuses",
        tasks=10,
        repeats=4,
        dead=True,
    ),
    Case(
        name="429",
        title="429 forever: 40 rollouts (10 tasks x 4) at 8 in flight, every request 429, "
        "no Retry-After",
        tasks=10,
        repeats=4,
        plan={"seed": 21, "rate": 1.0, "mix": [_429]},
    ),
    Case(
        name="polite",
        title="polite 429: 16 rollouts at 8 in flight, requests 0 and 1 of attempt 0 answered "
        "429 + Retry-After: 0.05, then 200",
        tasks=16,
        script=tuple((0, request, {**_429, "retry_after": 0.05}) for request in (0, 1)),
    ),
    Case(
        name="mixed",
        title="mixed fault day: 60 rollouts (20 tasks x 3) at 8 in flight, 2-10 ms replies; "
        "of requests 10 % 503, 15 % 500, 10 % reset, 10 % not JSON",
        tasks=20,
        repeats=3,
        plan={
            "seed": 21,
            "rate": 0.45,
            "mix": [
                {"kind": "status", "status": 503, "weight": 10},
                {"kind": "status", "status": 500, "weight": 15},
                {"kind": "reset_mid_request", "weight": 10},
                {"kind": "not_json", "weight": 10},
            ],
        },
    ),
)


# --- the fake's side: a recording fault hook ----------------------------------------------------


class RecordingHook:
    """The fake's fault hook: log each ``/run`` (arrival time, key, fault), return its fault."""

    def __init__(self, log: TextIO, script: str | None, plan: Mapping[str, Any] | None) -> None:
        from trollout.testing import FaultScript, plan_from_dict

        self.log = log
        self.script = FaultScript(script) if script is not None else None
        self.plan = plan_from_dict(plan) if plan else None
        self._plans: dict[int, Any] = {}

    def __call__(self, context: Any) -> Any:
        """Return the request's fault (the script's, else the plan's for its request index)."""
        fault = self.script(context) if self.script is not None else None
        if fault is None and self.plan is not None:
            fault = self._plan_for(context.request_index).fault_for(
                context.task_index, context.rollout_index, context.attempt_index
            )
        kind = "-" if fault is None else fault.kind.value
        self.log.write(
            f"{time.monotonic():.6f} {context.task_index} {context.rollout_index} "
            f"{context.attempt_index} {context.request_index} {kind}\n"
        )
        return fault

    def _plan_for(self, request: int) -> Any:
        # One plan per request index (its seed moved): the draws stay a pure function of the
        # request's key, as FaultPlan's design note wants, but a re-send meets a fresh draw.
        import attrs

        plan = self._plans.get(request)
        if plan is None:
            assert self.plan is not None
            plan = self._plans[request] = attrs.evolve(self.plan, seed=self.plan.seed + request)
        return plan


def fake_main(config_path: str) -> None:
    """Serve the fake deployment with a `RecordingHook` (the child ``--fake CONFIG``)."""
    import trio

    from trollout.testing import load_spec, serve_until_signal

    config = orjson.loads(Path(config_path).read_bytes())
    spec = load_spec(config["spec"])
    with open(config["log"], "w", buffering=1) as log:  # a line per request, even if killed
        hook = RecordingHook(log, config["script"], config["plan"])
        trio.run(lambda: serve_until_signal(spec, record_runs=False, fault_fn=hook))


@contextmanager
def recording_fake(case: Case, folder: Path) -> Iterator[tuple[str, Path]]:
    """Run the fake for one run of `case`; yield its ``/run`` base URL and its request log."""
    from trollout.testing import FakeUrls, fault_from_dict, write_fault_script

    spec = folder / "spec.yaml"
    latency = "".join(f"\n  {k}: {v}" for k, v in case.latency.items())
    spec.write_text(f"{SPEC}latency:{latency}\n")
    script = None
    if case.script:
        script = str(folder / "faults.jsonl")
        entries: dict[tuple[str | None, int, int, int, int], Any] = {
            (None, task, rollout, attempt, request): fault_from_dict(fault)
            for task in range(case.tasks)
            for rollout in range(case.repeats)
            for attempt, request, fault in case.script
        }
        write_fault_script(script, entries)
    log = folder / "requests.log"
    config = {"spec": str(spec), "log": str(log), "script": script, "plan": case.plan}
    (folder / "fake.json").write_bytes(orjson.dumps(config))
    env = dict(os.environ, PYTHONPATH=str(SRC))
    proc = subprocess.Popen(
        [sys.executable, __file__, "--fake", str(folder / "fake.json")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60.0)
        line = proc.stdout.readline() if ready else b""
        if not line:
            raise RuntimeError(f"the fake (pid {proc.pid}) printed no ready line")
        urls = FakeUrls.from_json(orjson.loads(line))
        yield urls.run_urls[AGENT], log
    finally:
        if proc.poll() is None:
            proc.terminate()  # this pid only
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def refused_url() -> str:
    """Return a URL on 127.0.0.1 whose port nothing listens on (bound, read, closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# --- the command's side -------------------------------------------------------------------------


def child_main(argv: list[str]) -> None:
    """Run ``trollout <argv>`` in this process (the child ``--child``)."""
    sys.argv = ["trollout", *argv]
    from trollout.cli.main import main as trollout_main

    trollout_main()


@dataclass
class Run:
    """What one run of one case showed."""

    wall_s: float
    cpu_s: float
    exit: int
    timed_out: bool
    settled_at_timeout: int | None
    landed: int
    failed: Counter[str]
    expected: int
    dispatch_s: float | None
    retries: str
    requests: list[int] | None  # per rollout of the plan (None: no fake)
    longest_gap_s: float | None
    tail_s: float | None  # from the last request to the command's exit

    @property
    def not_settled(self) -> int:
        """Return the rollouts neither landed nor failed when the command exited."""
        return self.expected - self.landed - sum(self.failed.values())


def run_case(case: Case, src: Path, folder: Path, timeout_s: float) -> Run:
    """Run `case` once with trollout from `src`; return what it showed."""
    folder.mkdir(parents=True)
    rows = folder / "tasks.jsonl"
    from trollout.testing import write_tasks

    write_tasks(rows, case.tasks, seed=21)
    if case.dead:
        return _run_collect(case, src, folder, rows, refused_url(), None, timeout_s)
    with recording_fake(case, folder) as (url, log):
        return _run_collect(case, src, folder, rows, url, log, timeout_s)


def _run_collect(
    case: Case,
    src: Path,
    folder: Path,
    rows: Path,
    url: str,
    log: Path | None,
    timeout_s: float,
) -> Run:
    out = folder / "run" / "r.jsonl"
    command = [
        sys.executable,
        __file__,
        "--child",
        "collect",
        str(rows),
        "-o",
        str(out),
        "--agent-url",
        f"{AGENT}={url}",
        "--agent",
        AGENT,
        "--num-repeats",
        str(case.repeats),
        "--no-aggregate",
        "--progress",
        "plain",
        f"+num_samples_in_parallel={case.in_flight}",
        *case.args,
    ]
    env = dict(os.environ, PYTHONPATH=str(src))
    stdout_path, stderr_path = folder / "stdout", folder / "stderr"
    with stdout_path.open("w") as stdout, stderr_path.open("w") as stderr:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, env=env
        )
        stopper = _Stopper(proc.pid, out)
        timer = threading.Timer(timeout_s, stopper.stop)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            stopper.reaped()
            timer.cancel()
        ended = time.monotonic()
    proc.returncode = os.waitstatus_to_exitcode(status)
    landed, failed = read_outcomes(out)
    text = stdout_path.read_text(errors="replace")
    requests, gap, tail = read_requests(log, case, ended) if log is not None else (None,) * 3
    return Run(
        wall_s=ended - t0,
        cpu_s=usage.ru_utime + usage.ru_stime,
        exit=proc.returncode,
        timed_out=stopper.settled is not None,
        settled_at_timeout=stopper.settled,
        landed=landed,
        failed=failed,
        expected=case.rollouts,
        dispatch_s=dispatch_seconds(text),
        retries=retry_line(text, stderr_path.read_text(errors="replace")),
        requests=requests,
        longest_gap_s=gap,
        tail_s=tail,
    )


class _Stopper:
    """SIGTERM a run at its timeout (noting what had settled), SIGKILL it if it lingers."""

    def __init__(self, pid: int, out: Path) -> None:
        self.pid, self.out = pid, out
        self.settled: int | None = None
        self._lock = threading.Lock()
        self._alive = True
        self._kill = threading.Timer(KILL_GRACE_S, self._signal, (signal.SIGKILL,))

    def stop(self) -> None:
        landed, failed = read_outcomes(self.out)
        self.settled = landed + sum(failed.values())
        if self._signal(signal.SIGTERM):
            self._kill.start()

    def reaped(self) -> None:
        with self._lock:
            self._alive = False
        self._kill.cancel()

    def _signal(self, signum: int) -> bool:
        with self._lock:  # never signal a pid once it is reaped (it may be someone else's)
            if self._alive:
                os.kill(self.pid, signum)
            return self._alive


def read_outcomes(out: Path) -> tuple[int, Counter[str]]:
    """Return rollouts landed, and the rollouts that did not land by ``class/kind``."""
    landed: set[tuple[int, int]] = set()
    if out.exists():
        for line in out.open("rb"):
            if line.strip():
                row = orjson.loads(line)
                landed.add((row.get("_ng_task_index"), row.get("_ng_rollout_index")))
    latest: dict[tuple[int, int], str] = {}
    failures = out.with_name(f"{out.stem}_failures.jsonl")
    if failures.exists():
        for line in failures.open("rb"):
            if line.strip():
                row = orjson.loads(line)
                key = (row.get("_ng_task_index"), row.get("_ng_rollout_index"))
                kind = f"{row.get('_ng_failure_class')}/{row.get('failure_kind')}"
                latest[key] = kind
    failed = Counter(kind for key, kind in latest.items() if key not in landed)
    return len(landed), failed


_DISPATCH = re.compile(r"run timing report: ([0-9.]+)(s|m) since dispatch began")
_RETRIES = re.compile(r"retries \d+ \(waited [^)]*\).*")


def dispatch_seconds(stdout: str) -> float | None:
    """Return the dispatch time of the command's timing report (None: not printed)."""
    found = _DISPATCH.findall(stdout)
    if not found:
        return None
    value, unit = found[-1]
    return float(value) * (60.0 if unit == "m" else 1.0)


def retry_line(stdout: str, stderr: str) -> str:
    """Return the retry summary of the timing report, else of the last progress line."""
    for text in (stdout, stderr):
        found: list[str] = _RETRIES.findall(text)
        if found:
            return found[-1].strip()
    return "-"


def read_requests(
    log: Path, case: Case, ended: float
) -> tuple[list[int], float | None, float | None]:
    """Return requests per planned rollout, the longest gap between requests, last -> exit."""
    per: Counter[tuple[int, int]] = Counter()
    times: list[float] = []
    if log.exists():
        for line in log.read_text().splitlines():
            t, task, rollout, *_ = line.split()
            times.append(float(t))
            per[(int(task), int(rollout))] += 1
    counts = [per[(t, r)] for t in range(case.tasks) for r in range(case.repeats)]
    times.sort()
    gap = max((b - a for a, b in itertools.pairwise(times)), default=None)
    tail = ended - times[-1] if times else None
    return counts, gap, tail


# --- the table ----------------------------------------------------------------------------------


def _num(values: Sequence[float | None], fmt: str) -> str:
    present = [v for v in values if v is not None]
    return fmt.format(statistics.median(present)) if present else "-"


def _distinct(values: list[str]) -> str:
    seen = list(dict.fromkeys(values))
    return seen[0] if len(seen) == 1 else " ; ".join(values)


def describe(name: str, runs: list[Run], timeout_s: float) -> list[str]:
    """Return the table row of one variant of one case (medians over its runs), and details."""
    walls = [
        f">{timeout_s:.0f} ({r.settled_at_timeout}/{r.expected} settled)"
        if r.timed_out
        else f"{r.wall_s:.1f}"
        for r in runs
    ]
    if len(runs) == 1 or any(r.timed_out for r in runs):
        wall = ", ".join(walls)
    else:
        wall = f"{_num([r.wall_s for r in runs], '{:.1f}')} ({', '.join(walls)})"
    requests = [r.requests for r in runs if r.requests is not None]
    if requests:
        per_run_max = [float(max(c)) if c else 0.0 for c in requests]
        per_run_mean = [statistics.mean(c) if c else 0.0 for c in requests]
        req = f"{_num(per_run_max, '{:.0f}')}/{_num(per_run_mean, '{:.2f}')}"
    else:
        req = "-"
    kinds = _distinct(
        [", ".join(f"{k} {n}" for k, n in sorted(r.failed.items())) or "none" for r in runs]
    )
    row = (
        f"  {name:7s} {wall:>10s}  cpu {_num([r.cpu_s for r in runs], '{:.1f}')} s  "
        f"exit {_distinct([str(r.exit) for r in runs])}  "
        f"landed {_num([r.landed for r in runs], '{:.0f}')}  "
        f"failed {_num([sum(r.failed.values()) for r in runs], '{:.0f}')}  "
        f"not settled {_num([r.not_settled for r in runs], '{:.0f}')}  "
        f"dispatch {_num([r.dispatch_s for r in runs], '{:.1f}')} s  "
        f"requests/rollout max/mean {req}  "
        f"longest gap {_num([r.longest_gap_s for r in runs], '{:.2f}')} s  "
        f"(last request -> exit {_num([r.tail_s for r in runs], '{:.2f}')} s)"
    )
    return [
        row,
        f"          failed by class/kind: {kinds}",
        f"          {_distinct([r.retries for r in runs])}",
    ]


# --- main ---------------------------------------------------------------------------------------


def _import_path(src: Path) -> str:
    """Return where a child with ``PYTHONPATH=src`` imports trollout from (a sanity line)."""
    code = "import trollout, sys; sys.stdout.write(trollout.__file__)"
    env = dict(os.environ, PYTHONPATH=str(src))
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout


def main() -> None:
    """Parse the options, run every chosen case for every variant, print the table."""
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(sys.argv[2:])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--fake":
        fake_main(sys.argv[2])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    names = [c.name for c in CASES]
    parser.add_argument("--cases", default=",".join(names), help=f"some of {','.join(names)}")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each case per variant")
    parser.add_argument("--src", default=str(SRC), help="the src folder measured as 'now'")
    parser.add_argument("--compare-src", help="also run trollout imported from this src folder")
    parser.add_argument("--timeout", type=float, default=420.0, help="seconds per run at most")
    args = parser.parse_args()
    chosen = args.cases.split(",")
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        parser.error(f"unknown cases {unknown}; choose from {','.join(names)}")
    variants = {"now": Path(args.src).resolve()}
    if args.compare_src:
        variants["before"] = Path(args.compare_src).resolve()
    for name, src in variants.items():
        print(f"{name}: trollout from {_import_path(src)}", flush=True)
    print(
        f"trollout collect --no-aggregate, one child per run, timeout {args.timeout:.0f} s; "
        f"{args.repeats} run(s) per case and variant, alternated; numbers are medians",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="trollout-retry-days-") as tmp:
        for case in (c for c in CASES if c.name in chosen):
            print(f"{case.name}: {case.title}", flush=True)
            runs: dict[str, list[Run]] = {name: [] for name in variants}
            for i in range(args.repeats):
                for name, src in variants.items():
                    folder = Path(tmp, f"{case.name}-{name}-{i}")
                    runs[name].append(run_case(case, src, folder, args.timeout))
            for name, got in runs.items():
                print("\n".join(describe(name, got, args.timeout)), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
