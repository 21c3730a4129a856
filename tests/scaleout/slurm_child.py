"""The child process of `slurm_session`: the session's Slurm and its background scenarios.

    python slurm_child.py FOLDER SCENARIO [SCENARIO ...]

Starts Slurm in ``FOLDER/cluster`` and writes ``FOLDER/cluster.ready`` (with the daemons' pids
in ``cluster.pids``), or ``FOLDER/cluster.error`` with the reason it cannot; runs each scenario
(`slurm_scenarios.SCENARIOS`), writing ``FOLDER/<name>.json`` or ``FOLDER/<name>.error`` (the
traceback); then waits for its stdin to close and stops the daemons it started, by pid.
Every marker file is written whole (a temp file, then a rename): the test process polls them.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path


def publish(path: Path, text: str) -> None:
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text(text)
    os.replace(temp, path)


def main(folder: Path, names: list[str]) -> None:
    import slurm_session
    from slurm_cluster import SlurmUnavailableError, start_slurm
    from slurm_scenarios import SCENARIOS

    slurm_session._state["folder"] = folder  # scratch() is this folder here too
    try:
        cluster = start_slurm(folder / "cluster")
    except SlurmUnavailableError as exc:
        publish(folder / slurm_session.ERROR, str(exc))
        return
    try:
        slurm_session._state["cluster"] = cluster
        publish(folder / slurm_session.PIDS, " ".join(str(p.pid) for p in cluster.procs))
        publish(folder / slurm_session.READY, str(folder / "cluster"))
        for name in names:
            try:
                publish(folder / f"{name}.json", json.dumps(SCENARIOS[name]()))
            except BaseException:  # handed to the test that asks (`Background.result`)
                publish(folder / f"{name}.error", traceback.format_exc())
        sys.stdin.read()  # until the test process closes it (or ends)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
