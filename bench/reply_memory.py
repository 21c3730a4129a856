"""Peak RSS of `trollout collect` given one 2 GB reply, per reply size limit.

    .venv/bin/python bench/reply_memory.py [--size 2000000000] [--limits 67108864,default]

The fake deployment (its own process) answers the one rollout with a 200 whose body is a
``size``-byte JSON string made as it is sent, declared by Content-Length or streamed until EOF.
The collector runs as ``python -m trollout.cli.main collect`` and reports its own VmHWM at exit
(a child's rusage would count the parent it was forked from). Printed per limit and framing:
peak RSS in MiB and the failure kind.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPORTER = """
import atexit, sys
def report(path=sys.argv[1]):
    with open("/proc/self/status") as status, open(path, "w") as out:
        out.write(next(line for line in status if line.startswith("VmHWM")))
atexit.register(report)
sys.argv = ["trollout", *sys.argv[2:]]
from trollout.cli.main import main
main()
"""


def measure(head: str, folder: Path, limit: str) -> tuple[float, str]:
    """Run one collection; return its peak RSS (MiB) and the failure kind it recorded."""
    peak = folder / "peak.txt"
    command = [sys.executable, "-c", REPORTER, str(peak), "collect", str(folder / "tasks.jsonl")]
    command += ["-o", str(folder / "run" / "r.jsonl"), "--head-server", head, "--agent", "a"]
    command += ["--progress", "plain", "--no-aggregate"]
    command += [] if limit == "default" else ["--max-reply-bytes", limit]
    subprocess.run(command, capture_output=True, check=True)
    failures = (folder / "run" / "r_failures.jsonl").read_text().splitlines()
    kind = json.loads(failures[0])["failure_kind"] if failures else "landed"
    return int(peak.read_text().split()[1]) / 1024, kind


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=2_000_000_000)
    parser.add_argument("--limits", default="67108864,default")
    args = parser.parse_args()
    from trollout.testing import DeploymentSpec, spawn_fake_deployment, task_row

    spec = DeploymentSpec(agents=("a",), record_runs=False)
    with spawn_fake_deployment(spec) as fake:
        for until_eof in (False, True):
            for limit in args.limits.split(","):
                with tempfile.TemporaryDirectory() as tmp:
                    folder = Path(tmp)
                    fault = {"kind": "oversized", "status": 200, "size": args.size}
                    row = task_row("What is 2 + 3?") | {
                        "fake_fault": fault | {"until_eof": until_eof}
                    }
                    (folder / "tasks.jsonl").write_text(json.dumps(row) + "\n")
                    peak, kind = measure(fake.head_url, folder, limit)
                framing = "until EOF" if until_eof else "Content-Length"
                print(
                    f"{args.size} B reply, {framing:14s} limit {limit:>10s}: "
                    f"peak RSS {peak:6.1f} MiB, {kind}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
