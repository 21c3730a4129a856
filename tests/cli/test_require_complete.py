"""`--require-complete`: a run that left work undone exits 75 (retryable) or 76 (final)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from trollout.cli.main import cli
from trollout.testing import FakeUrls


def write_rows(path: Path, fault: dict[str, object] | None) -> Path:
    """Three tasks; the second carries a scripted fault for every attempt."""
    rows = []
    for i in range(3):
        row: dict[str, object] = {
            "responses_create_params": {
                "input": [{"role": "user", "content": f"What is {i} + 1?"}]
            },
            "expected_answer": str(i + 1),
        }
        if i == 1 and fault is not None:
            row["fake_fault"] = fault
        rows.append(json.dumps(row))
    path.write_text("\n".join(rows) + "\n")
    return path


def collect(tmp_path: Path, fake: FakeUrls, fault: dict[str, object] | None) -> tuple[int, str]:
    """Run collect with --require-complete; return exit code and stderr."""
    source = write_rows(tmp_path / "in.jsonl", fault)
    out = tmp_path / "r.jsonl"
    result = CliRunner().invoke(
        cli,
        [
            "collect",
            str(source),
            "-o",
            str(out),
            "--head-server",
            fake.head_url,
            "--agent",
            "math_agent",
            "--require-complete",
            "--progress",
            "plain",
        ],
    )
    return result.exit_code, result.stderr


def test_require_complete_exits_0_when_everything_landed(tmp_path: Path, fake: FakeUrls) -> None:
    """Every rollout landed: the run is scored and exits 0."""
    code, err = collect(tmp_path, fake, None)
    assert code == 0, err
    assert (tmp_path / "r_aggregate_metrics.json").exists()


def test_require_complete_exits_75_when_retryable_work_remains(
    tmp_path: Path, fake: FakeUrls
) -> None:
    """A 500 leaves a retryable rollout: exit 75 and no score written."""
    code, err = collect(tmp_path, fake, {"kind": "status", "status": 500})
    assert code == 75, err
    assert "1 of 3 rollouts did not land" in err
    assert not (tmp_path / "r_aggregate_metrics.json").exists()


def test_require_complete_exits_76_when_nothing_can_be_retried(
    tmp_path: Path, fake: FakeUrls
) -> None:
    """A terminal failure leaves nothing to retry: exit 76."""
    fault = {"kind": "failure_class", "failure_class": "skipped", "terminal": True}
    code, err = collect(tmp_path, fake, fault)
    assert code == 76, err
    assert "none can be retried" in err
