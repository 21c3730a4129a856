"""Measure ``trollout view`` on a big run: time to the first page, to filtered pages, peak RSS.

A run folder of N rollouts (default 100,000; 4 repeats per task) is generated under ``--dir``:
materialized inputs, a rollouts file (95% landed, rows of about 1.5 kB: a prompt, an answer,
usage, reward) and a failures sidecar (5% failed, a fifth of them retried once). Then
``trollout view`` is started in its own process and asked, over loopback, for:

- the first page (``/api/run/0/rollouts?limit=100``), timed from the process's start: the
  interpreter, the imports, and the first indexing step (the view indexes in steps of 4 MiB
  per file and answers between them; the page says "indexing…" and follows until done);
- the whole run indexed: polled (the summary's ``indexing``) from the process's start;
- then, on the whole index: a filtered page (``outcome=failed``), a sorted one
  (``sort=reward&desc=1``) and a text search (``q=...``, a word in about 1% of prompts),
  each timed alone;
- the view's peak RSS (VmHWM of its process) after all of them.

Goal (issue 27): first page < 1 s, RSS < 200 MiB.

    .venv/bin/python bench/view.py [--rollouts 100000] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson

REPEATS = 4


def generate(folder: Path, rollouts: int) -> Path:
    """Write the run folder; return its output path."""
    out = folder / "r.jsonl"
    with (
        open(folder / "r_materialized_inputs.jsonl", "wb") as inputs,
        open(out, "wb") as landed,
        open(folder / "r_failures.jsonl", "wb") as failures,
    ):
        for n in range(rollouts):
            task, rollout = divmod(n, REPEATS)
            rare = " zanzibar" if task % 100 == 7 else ""
            prompt = f"Task {task}: what is {task} + {rollout}?{rare} " + "context " * 60
            params = {"input": [{"role": "user", "content": prompt}]}
            stamps = {
                "_ng_task_index": task,
                "_ng_rollout_index": rollout,
                "agent_ref": {"name": f"agent_{task % 3}"},
            }
            inputs.write(orjson.dumps({"responses_create_params": params, **stamps}) + b"\n")
            failure = {
                "_ng_failure_class": "agent_run_error",
                "_ng_failure_message": "HTTP 500",
                "_ng_failure_http_status": 500,
                "failure_kind": "http_500",
                "elapsed_seconds": 0.5,
                **stamps,
            }
            if n % 20 == 0:  # 5% fail ...
                failures.write(orjson.dumps(failure) + b"\n")
                if n % 100 != 0:  # ... and four in five of them stay failed
                    continue
            answer = str(task + rollout)
            row = {
                "responses_create_params": params,
                "response": {
                    "output": [
                        {
                            "type": "message",
                            "role": "assistant",
                            "content": [{"type": "output_text", "text": answer}],
                        }
                    ],
                    "usage": {"input_tokens": 80, "output_tokens": 3},
                },
                "reward": float(n % 3 == 0),
                "elapsed_seconds": 1.0 + (n % 97) / 10,
                **stamps,
            }
            landed.write(orjson.dumps(row) + b"\n")
    return out


def timed_get(client: httpx.Client, url: str) -> tuple[float, dict[str, object]]:
    start = time.perf_counter()
    response = client.get(url)
    response.raise_for_status()
    return time.perf_counter() - start, response.json()


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=100_000)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        out = generate(Path(tmp), args.rollouts)
        size = sum(f.stat().st_size for f in Path(tmp).iterdir()) / 2**20
        print(f"view: {args.rollouts:,} rollouts, run folder {size:.0f} MiB")
        command = [sys.executable, "-m", "trollout.cli.main", "view", str(out), "--port", "0"]
        start = time.perf_counter()
        proc = subprocess.Popen([*command, "--no-browser"], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            url = re.search(r"http://\S+/", proc.stdout.readline())
            assert url is not None
            base = url.group(0) + "api/run/0"
            with httpx.Client(timeout=120) as client:
                _, page = timed_get(client, base + "/rollouts?limit=100")
                first = time.perf_counter() - start
                print(
                    f"  first page (start, index, answer)  {first:6.2f} s  ({page['total']:,} rows)"
                )
                while timed_get(client, base)[1]["indexing"]:
                    time.sleep(0.05)
                whole = time.perf_counter() - start
                print(f"  whole run indexed (polled)          {whole:6.2f} s")
                for label, query in (
                    ("filtered page (outcome=failed)", "outcome=failed"),
                    ("sorted page (reward, desc)", "sort=reward&desc=1"),
                    ("text search (q=zanzibar)", "q=zanzibar"),
                    ("same search again (cached)", "q=zanzibar"),
                    ("run summary", None),
                ):
                    url_ = base if query is None else f"{base}/rollouts?limit=100&{query}"
                    took, answer = timed_get(client, url_)
                    matched = answer.get("matched", "")
                    print(f"  {label:<35} {took:6.2f} s  {matched}")
                took, _ = timed_get(client, base + "/rollout/0/1234/2")
                print(f"  {'one rollout page':<35} {took:6.3f} s")
            print(f"  peak RSS of the view                {peak_rss_mib(proc.pid):6.0f} MiB")
        finally:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
