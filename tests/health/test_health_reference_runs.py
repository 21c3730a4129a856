"""The health check against NeMo Gym 0.7.0's own files, run by run.

Each case re-checks a rollouts file NeMo Gym's wheel wrote (or the hand-edited copy its checker
judged) and compares: ``rollout_verdicts.jsonl`` line by line, byte for byte (the unreadable
line's ``source_file`` is the only path in it, and is replaced by the checked file's),
``quality_summary.json`` equal as JSON, and the two report lines. The cases run twice: on the
project's own copies (tests/fixtures/health, so CI needs nothing else) and, when the reference
tree is present beside the repository, on the reference files themselves.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from trollout.health import check_run, spool

FIXTURES = Path(__file__).parents[1] / "fixtures" / "health"
REFERENCE = Path(__file__).parents[3] / "shared/reference/nemo_gym_0.7.0/observability/runs"
IGNORE3 = ("model_call_failed", "rollout_ended_on_failed_model_call", "task_consistently_unhealthy")

# case: (the run whose rollouts are checked, the run holding the expected files, ignored checks,
# the expected first report line)
CASES = {
    "obs_on_healthy": ("obs_on_healthy", "obs_on_healthy", (), "20 checked, 20 healthy, 0 unh"),
    "obs_on_model_500": ("obs_on_model_500", "obs_on_model_500", (), "14 checked, 13 healthy"),
    "obs_servers_only": ("obs_servers_only", "obs_servers_only", (), "20 checked, 0 healthy"),
    "edited_unhealthy": ("edited_unhealthy", "edited_unhealthy", (), "22 checked, 6 healthy"),
    "edited_unhealthy_ignore3": (
        "edited_unhealthy",
        "edited_unhealthy_ignore3",
        IGNORE3,
        "22 checked, 8 healthy, 13 unhealthy, 1 unobserved (ignored: model_call_failed, "
        "rollout_ended_on_failed_model_call, task_consistently_unhealthy)",
    ),
    "aggregate": ("obs_on_healthy", "aggregate", (), "20 checked, 20 healthy"),
}
_SOURCE = re.compile(r'"source_file":"[^"]*"')


def _check(root: Path, case: str, tmp_path: Path, workers: int = 1) -> None:
    source, expected, ignored, first_line = CASES[case]
    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_bytes(gzip.decompress((root / source / "rollouts.jsonl.gz").read_bytes()))
    report = check_run(rollouts, tmp_path, ignored_checks=ignored, workers=workers)

    ours = (tmp_path / "rollout_verdicts.jsonl").read_text(encoding="ascii")
    theirs = (root / expected / "rollout_verdicts.jsonl").read_text(encoding="ascii")
    here = f'"source_file":{json.dumps(str(rollouts))}'
    theirs = _SOURCE.sub(lambda _: here, theirs)
    assert ours.splitlines() == theirs.splitlines()
    assert ours == theirs  # the newline at the end too
    summary = json.loads((tmp_path / "quality_summary.json").read_text(encoding="ascii"))
    assert summary == json.loads((root / expected / "quality_summary.json").read_text())
    assert report.lines()[0].startswith(f"Rollout health: {first_line}")
    assert report.lines()[1] == f"Quality summary: {tmp_path / 'quality_summary.json'}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_fixture_copy_matches_nemo_gym(case: str, tmp_path: Path) -> None:
    """The project's copies of NeMo Gym's runs: identical verdicts, equal summaries."""
    _check(FIXTURES, case, tmp_path)


@pytest.mark.parametrize("case", sorted(CASES))
def test_spilled_fixture_copy_matches_nemo_gym(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same, with the sort going through runs of 3 rows on disk (trollout.health.spool)."""
    monkeypatch.setattr(spool, "RUN_ROWS", 3)
    monkeypatch.setattr(spool, "BLOCK_ROWS", 2)
    _check(FIXTURES, case, tmp_path)


@pytest.mark.parametrize("case", sorted(CASES))
def test_reference_run_matches_nemo_gym(case: str, tmp_path: Path) -> None:
    """The reference runs themselves (skipped only when ../shared is absent)."""
    if not REFERENCE.is_dir():
        pytest.skip(f"{REFERENCE} is absent")
    _check(REFERENCE, case, tmp_path)


def test_printed_lines_are_nemo_gyms(tmp_path: Path) -> None:
    """The two report lines are NeMo Gym's, path aside (its health_check.stdout files)."""
    for case in ("edited_unhealthy", "edited_unhealthy_ignore3"):
        source, expected, ignored, _ = CASES[case]
        folder = tmp_path / case
        folder.mkdir()
        rollouts = folder / "rollouts.jsonl"
        rollouts.write_bytes(
            gzip.decompress((FIXTURES / source / "rollouts.jsonl.gz").read_bytes())
        )
        report = check_run(rollouts, folder, ignored_checks=ignored)
        printed = (FIXTURES / expected / "health_check.stdout").read_text().splitlines()
        assert report.lines()[0] == printed[0]
        assert printed[1].startswith("Quality summary: /srv/gym/runs/")
        assert report.lines()[1] == f"Quality summary: {folder / 'quality_summary.json'}"


def test_ignoring_one_check_gives_nemo_gyms_json_summary(tmp_path: Path) -> None:
    """``--json --ignore model_call_failed`` of the reference CLI transcript: the same summary."""
    rollouts = tmp_path / "rollouts.jsonl"
    data = (FIXTURES / "edited_unhealthy" / "rollouts.jsonl.gz").read_bytes()
    rollouts.write_bytes(gzip.decompress(data))
    report = check_run(rollouts, tmp_path, ignored_checks="model_call_failed")
    expected = FIXTURES / "cli" / "ignore_model_call_failed.quality_summary.json"
    assert report.summary == json.loads(expected.read_text())


def test_workers_give_the_same_files(tmp_path: Path) -> None:
    """A pool of worker processes writes byte-identical files (a file large enough for one)."""
    rows = gzip.decompress((FIXTURES / "edited_unhealthy" / "rollouts.jsonl.gz").read_bytes())
    big = rows * 8  # ~2.6 MB: over the inline threshold, with duplicates everywhere
    files = {}
    for workers in (1, 2):
        folder = tmp_path / f"w{workers}"
        folder.mkdir()
        (folder / "rollouts.jsonl").write_bytes(big)
        check_run(folder / "rollouts.jsonl", folder, workers=workers)
        files[workers] = [
            (folder / name).read_bytes().replace(str(folder).encode(), b"X")
            for name in ("rollout_verdicts.jsonl", "quality_summary.json")
        ]
    assert files[1] == files[2]
