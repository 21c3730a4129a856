"""The distributed options on the command line: refusals, the plain path without Ray, sbatch."""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from builders import invoke, write_tasks_input
from trollout.scaleout.sbatch import parse_slurm_time

BAD = [
    (["--shard", "5/4"], "has no shard 5 of 4"),
    (["--shard", "0/0"], "must be at least 1"),
    (["--shard", "two"], "two integers such as 0/4"),
    (["--ray", "--workers", "0"], "ray_workers must be an integer from 1"),
    (["--workers", "4"], "needs --ray"),
    (["--ray", "--shard", "0/2"], "do not go together"),
    pytest.param(
        ["--ray", "not-an-address"],
        "is not a Ray address",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("ray") is None,
            reason="needs Ray (make test installs it): without it --ray is refused first",
        ),
    ),
    pytest.param(
        ["--ray", "not-an-address"],
        "--ray needs Ray, which is not installed; pip install 'trollout[ray]'",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("ray") is not None, reason="Ray is installed"
        ),
    ),
    (["--ray", "--metrics-port", "9464"], "--metrics-port 9464 and --ray do not go together"),
    (["--ray", "--metrics-port", "0"], "--metrics-port 0 and --ray do not go together"),
]


def closed_port() -> int:
    """Return a loopback port where nothing listens (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.mark.parametrize(("extra", "needle"), BAD)
def test_collect_refuses_bad_distributed_options_in_one_line(
    tmp_path: Path, extra: list[str], needle: str
) -> None:
    """--shard 5/4, 0/0, --workers 0, ...: one line, exit 2, nothing written."""
    source = write_tasks_input(tmp_path / "tasks.jsonl", 3)
    out = tmp_path / "out" / "run.jsonl"
    result = invoke(
        "collect", str(source), "-o", str(out), "--agent-url", "a=http://127.0.0.1:1", *extra
    )
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("trollout: error:")
    assert needle in lines[0]
    assert not out.parent.exists()


def test_collect_refuses_an_unreachable_ray_address(tmp_path: Path) -> None:
    """--ray 127.0.0.1:<nothing listening>: one line naming the address, exit 2, nothing written."""
    pytest.importorskip("ray")
    source = write_tasks_input(tmp_path / "tasks.jsonl", 3)
    out = tmp_path / "out" / "run.jsonl"
    address = f"127.0.0.1:{closed_port()}"
    result = invoke(
        "collect",
        str(source),
        "-o",
        str(out),
        "--agent-url",
        "a=http://127.0.0.1:1",
        "--ray",
        address,
    )
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    assert f"cannot reach the Ray cluster at {address!r}" in lines[0]
    assert not out.parent.exists()


def test_plain_command_line_never_imports_ray() -> None:
    """Importing the CLI (and so every plain command) leaves Ray unimported."""
    code = "import sys, trollout, trollout.cli.main; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_sbatch_writes_an_array_script_with_the_shard_count_baked_in(tmp_path: Path) -> None:
    """The script: array 0..N-1, SIGTERM before the limit, requeue, logs appended per task,
    --shard $ID/N --resume --no-retry-failed, and the merge command."""
    source = write_tasks_input(tmp_path / "tasks.jsonl", 3)
    script = tmp_path / "job.sh"
    out = tmp_path / "runs" / "eval.jsonl"
    result = invoke(
        "sbatch", "--shards", "8", "--time", "4:00:00", "--script", str(script),
        str(source), "-o", str(out), "--agent", "math_agent", "+num_repeats=4",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    text = script.read_text()
    assert "#SBATCH --array=0-7" in text
    assert "#SBATCH --time=4:00:00" in text
    assert "#SBATCH --signal=B:TERM@120" in text
    assert '--shard "$ID/$SHARDS" --resume' in text
    assert "SHARDS=8" in text
    merge = next(line for line in text.splitlines() if "--dependency=afterok" in line)
    assert (
        f"aggregate '\"'\"'{out.parent}/eval_shards/*-of-00008/eval.jsonl'\"'\"' -o {out}" in merge
    )
    assert "#SBATCH --requeue" in text
    assert "#SBATCH --open-mode=append" in text
    assert f"#SBATCH --output={out.parent}/eval_shards/logs/slurm-%A_%a.out" in text
    assert "--resume --no-retry-failed" in text
    assert "+num_repeats=4" in text
    collect = next(line for line in text.splitlines() if "trollout.cli.main collect" in line)
    assert " -o " not in collect  # the job's own output replaces the run's: -o "$OUT" only
    made = sorted(str(p.relative_to(tmp_path)) for p in out.parent.rglob("*"))
    assert made == ["runs/eval_shards", "runs/eval_shards/logs"]  # only the logs' folder


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--shards", "0"], "--shards must be at least 1"),
        (["--shards", "2", "--shard", "0/2"], "drop --shard"),
        (["--shards", "2", "--overwrite"], "drop --overwrite"),
        (["--shards", "2", "--num-repeats", "x"], "in the collect arguments"),
    ],
)
def test_sbatch_refuses_what_a_job_cannot_do(tmp_path: Path, args: list[str], needle: str) -> None:
    """Bad shard counts, per-job settings and bad collect options: one line, exit 2."""
    source = write_tasks_input(tmp_path / "tasks.jsonl", 3)
    result = invoke("sbatch", *args, str(source), "-o", str(tmp_path / "o.jsonl"))
    assert result.exit_code == 2, result.output
    assert needle in result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["--metrics-port", "9100"], {}, "--metrics-port 9100"),
        (["+metrics_port=9100"], {}, "--metrics-port 9100"),
        ([], {"OTEL_METRICS_EXPORTER": "prometheus"}, "OTEL_METRICS_EXPORTER=prometheus"),
    ],
)
def test_sbatch_refuses_a_fixed_prometheus_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str],
    needle: str,
) -> None:  # fmt: skip
    """Array jobs may share a node, where a second job could not bind a fixed port: refused
    in one line (exit 2) naming what asked for it; port 0 (any free one) is taken."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    source = write_tasks_input(tmp_path / "tasks.jsonl", 3)
    out = str(tmp_path / "o.jsonl")
    result = invoke("sbatch", "--shards", "2", str(source), "-o", out, *args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert needle in lines[0]
    assert "--metrics-port 0" in lines[0]
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_PORT", "0")
    free = invoke("sbatch", "--shards", "2", str(source), "-o", out, "--metrics-port", "0")
    assert free.exit_code == 0, free.output
    assert "--metrics-port 0" in free.output


def test_sbatch_help_says_how_jobs_serve_prometheus() -> None:
    """The --help names the rule: no fixed Prometheus port; 0, or OTLP."""
    result = invoke("sbatch", "--help")
    assert "--metrics-port 0" in " ".join(result.output.split())


def test_a_ray_run_refuses_a_shards_folder_that_is_a_link(tmp_path: Path) -> None:
    """<stem>_shards as a symlink: refused in one line before any cluster starts or file is made."""
    pytest.importorskip("ray")
    source = write_tasks_input(tmp_path / "tasks.jsonl", 3)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out" / "run.jsonl"
    out.parent.mkdir()
    (out.parent / "run_shards").symlink_to(elsewhere)
    result = invoke(
        "collect", str(source), "-o", str(out), "--agent-url", "a=http://127.0.0.1:1", "--ray"
    )
    assert result.exit_code == 2, result.output
    assert "is a symlink; trollout never writes through links" in result.output
    assert sorted(p.name for p in out.parent.iterdir()) == ["run_shards"]
    assert not any(elsewhere.iterdir())


def test_ray_progress_sums_ended_hand_outs_and_running_snapshots() -> None:
    """Driver progress: reports of ended hand-outs, snapshots of running ones."""
    pytest.importorskip("ray")
    from collections import Counter

    from trollout.collector.engine.progress import Progress
    from trollout.scaleout.ray.block import BlockReport
    from trollout.scaleout.ray.handout import HandoutEnd, total_progress

    ended = Progress(landed=3, reward_sum=2.0, scored=3)
    end = HandoutEnd(reports={(0, 1): BlockReport(0, ended, None, 11)})
    snapshots = {
        (0, 1): (Progress(landed=1), 5, 11),  # superseded by the report
        (1, 1): (Progress(landed=2, failed=Counter({"agent_run_error": 1}), omitted=1), 4, 12),
    }
    total, in_flight = total_progress(snapshots, end)
    assert (total.landed, total.omitted, total.scored, in_flight) == (5, 1, 3, 4)
    assert total.failed == Counter({"agent_run_error": 1})


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("2", 120.0),
        ("3:30", 210.0),
        ("1:00:00", 3600.0),
        ("2-0", 2 * 86400.0),
        ("1-2:30", 86400.0 + 2 * 3600 + 30 * 60),
        ("1-0:0:5", 86405.0),
        ("UNLIMITED", None),
        ("infinite", None),
        ("soon", None),
    ],
)
def test_slurm_time_forms_are_read_as_slurm_reads_them(text: str, seconds: float | None) -> None:
    """Every --time form of sbatch(1): minutes, m:s, h:m:s, d-h, d-h:m, d-h:m:s."""
    assert parse_slurm_time(text) == seconds


@pytest.mark.parametrize(("limit", "warned"), [("2", True), ("0:90", True), ("3", False)])
def test_sbatch_warns_of_a_time_limit_inside_the_signal_margin(
    tmp_path: Path, limit: str, warned: bool
) -> None:
    """A --time at or under the 120 s SIGTERM margin gets a warning (the script is still
    written: the user may mean it); a longer one does not."""
    source = write_tasks_input(tmp_path / "tasks.jsonl", 3)
    out = tmp_path / "runs" / "eval.jsonl"
    result = invoke("sbatch", "--shards", "2", "--time", limit, str(source), "-o", str(out))
    assert result.exit_code == 0, result.output
    assert ("signal margin" in result.output) is warned
    assert "#SBATCH --array=0-1" in result.output


def test_sbatch_submit_needs_a_script_file(tmp_path: Path) -> None:
    """--submit without --script: one line, exit 2, nothing written (Slurm runs a file)."""
    source = write_tasks_input(tmp_path / "tasks.jsonl", 3)
    out = tmp_path / "runs" / "eval.jsonl"
    result = invoke("sbatch", "--shards", "2", "--submit", str(source), "-o", str(out))
    assert result.exit_code == 2, result.output
    assert "--submit needs --script" in result.output
    assert not out.parent.exists()
