"""Seeds through `trollout collect` / `resume` against the bundled fake (issue 25, item 4):
NeMo Gym's values by default, hash seeds opt-in, and a run keeps the mode it was started with.

(NeMo Gym's reference files carry no seed, their run had no ``num_repeats_add_seed``; its seed
is the rollout index, which these tests pin.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from builders import invoke, read_jsonl
from trollout import jsonl
from trollout.collector.planning.seeds import rollout_seed
from trollout.testing import FakeUrls, task_rows


def collect(tmp_path: Path, fake: FakeUrls, *extra: str, resume: bool = False) -> Any:
    """Collect 3 tasks x 2 repeats with seeds through the fake's math_agent."""
    source = tmp_path / "in.jsonl"
    if not source.exists():
        source.write_bytes(b"".join(jsonl.dumps(r) for r in task_rows(3, seed=4)))
    out = tmp_path / "run" / "r.jsonl"
    again = ("--resume",) if resume else ()
    url = f"math_agent={fake.run_urls['math_agent']}"
    return invoke("collect", str(source), "-o", str(out), "--agent", "math_agent",
                  "--agent-url", url, "--num-repeats", "2", "+num_repeats_add_seed=true",
                  "--progress", "plain", *again, *extra)  # fmt: skip


def seeds(path: Path) -> dict[tuple[int, int], int]:
    """(task, rollout) -> the seed each row of a run file carries in its extra_body."""
    return {
        (r["_ng_task_index"], r["_ng_rollout_index"]): json.loads(
            r["responses_create_params"]["metadata"]["extra_body"]
        )["seed"]
        for r in read_jsonl(path)
    }


def output(tmp_path: Path) -> Path:
    return tmp_path / "run" / "r.jsonl"


def inputs(tmp_path: Path) -> Path:
    return tmp_path / "run" / "r_materialized_inputs.jsonl"


def test_collect_seeds_are_nemo_gyms_rollout_index_by_default(
    tmp_path: Path, fake: FakeUrls
) -> None:
    """Without --seed-mode every task's rollouts get seeds 0, 1 (NeMo Gym's), in the
    materialized inputs and in what the agent was sent; the manifest records the mode."""
    result = collect(tmp_path, fake)
    assert result.exit_code == 0, result.output
    expected = {(t, r): r for t in range(3) for r in range(2)}
    assert seeds(inputs(tmp_path)) == expected
    assert seeds(output(tmp_path)) == expected  # the fake echoes the request's parameters
    manifest = json.loads((tmp_path / "run" / "r_manifest.json").read_text())
    assert manifest["settings"]["seed_mode"] == "rollout-index"


def test_collect_hash_seeds_are_opt_in(tmp_path: Path, fake: FakeUrls) -> None:
    """--seed-mode hash gives trollout's hash(run seed, task, rollout) seeds."""
    result = collect(tmp_path, fake, "--seed-mode", "hash")
    assert result.exit_code == 0, result.output
    assert seeds(inputs(tmp_path)) == {
        (t, r): rollout_seed(0, t, r) for t in range(3) for r in range(2)
    }


def drop_seed_mode_and_a_landed_row(tmp_path: Path) -> None:
    """Make the run look started before seed_mode was saved, with one rollout left to run."""
    manifest_path = tmp_path / "run" / "r_manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["settings"].pop("seed_mode", None)
    manifest_path.write_text(json.dumps(manifest))
    rows = read_jsonl(output(tmp_path))
    output(tmp_path).write_bytes(b"".join(jsonl.dumps(r) for r in rows[1:]))


def test_resume_of_a_run_saved_without_seed_mode_keeps_hash_seeds(
    tmp_path: Path, fake: FakeUrls
) -> None:
    """A manifest that lacks seed_mode was written under the old default, hash: `trollout
    resume` and `collect --resume` continue it in hash mode (not refused as changed), and the
    rollout run again is sent its hash seed."""
    assert collect(tmp_path, fake, "--seed-mode", "hash").exit_code == 0
    drop_seed_mode_and_a_landed_row(tmp_path)
    result = invoke("resume", str(output(tmp_path)), "--progress", "plain")
    assert result.exit_code == 0, result.output
    hashed = {(t, r): rollout_seed(0, t, r) for t in range(3) for r in range(2)}
    assert seeds(output(tmp_path)) == hashed
    drop_seed_mode_and_a_landed_row(tmp_path)
    again = collect(tmp_path, fake, "--seed-mode", "hash", resume=True)
    assert again.exit_code == 0, again.output
    assert seeds(output(tmp_path)) == hashed


def test_collect_resume_of_a_seeded_hash_run_under_the_new_default_is_refused(
    tmp_path: Path, fake: FakeUrls
) -> None:
    """A seeded run started in hash mode is not resumed with other seeds by accident: collect
    --resume without --seed-mode names the change (exit 2); the folder is left as it was."""
    assert collect(tmp_path, fake, "--seed-mode", "hash").exit_code == 0
    drop_seed_mode_and_a_landed_row(tmp_path)
    before = output(tmp_path).read_bytes()
    result = collect(tmp_path, fake, resume=True)
    assert result.exit_code == 2, result.output
    assert "seed_mode 'hash' -> 'rollout-index'" in result.stderr
    assert output(tmp_path).read_bytes() == before


def test_collect_resume_of_an_unseeded_old_run_is_not_refused(
    tmp_path: Path, fake: FakeUrls
) -> None:
    """Without num_repeats_add_seed the seed mode changes nothing, so an old run (saved in hash
    mode, or without the key) resumes under the new default."""
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"".join(jsonl.dumps(r) for r in task_rows(3, seed=4)))
    url = f"math_agent={fake.run_urls['math_agent']}"
    common = ("collect", str(source), "-o", str(output(tmp_path)), "--agent", "math_agent",
              "--agent-url", url, "--progress", "plain")  # fmt: skip
    assert invoke(*common, "--seed-mode", "hash").exit_code == 0
    drop_seed_mode_and_a_landed_row(tmp_path)
    result = invoke(*common, "--resume")
    assert result.exit_code == 0, result.output
    assert len(read_jsonl(output(tmp_path))) == 3
