"""The fake policy's answers, the example fixtures and the synthetic dataset generator."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from trollout.testing import answer_row, solve, task_row, task_rows, write_tasks
from trollout.testing.policy import question_of, seed_of

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


@pytest.mark.parametrize(
    ("question", "answer"),
    [
        ("What is 17 + 25?", "42"),
        ("What is 5 - 12?", "-7"),
        ("What is 9 * 8?", "72"),
        ("Reverse the string 'hello'.", "olleh"),
        ("Convert 'trio' to upper case.", "TRIO"),
        ("How many letters are in 'banana'?", "6"),
        ("How many times does 's' appear in 'mississippi'?", "4"),
        ("Tell me a joke.", None),
    ],
)
def test_solve_answers_example_questions(question: str, answer: str | None) -> None:
    """The solver answers every example question kind, and nothing else."""
    assert solve(question) == answer


def _seeded(question: str, seed: int) -> dict[str, Any]:
    row = task_row(question)
    row["responses_create_params"]["metadata"] = {"extra_body": json.dumps({"seed": seed})}
    return row


def test_seed_of_reads_the_extra_body_json_string() -> None:
    """The seed comes from metadata.extra_body, else the rollout index."""
    assert seed_of(_seeded("What is 1 + 1?", 31)) == 31
    assert seed_of(task_row("What is 1 + 1?") | {"_ng_rollout_index": 4}) == 4
    bad = task_row("What is 1 + 1?")
    bad["responses_create_params"]["metadata"] = {"extra_body": "{not json"}
    assert seed_of(bad) == 0


def test_question_of_takes_the_last_user_message() -> None:
    """System messages and content parts are handled."""
    params = {
        "input": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "input_text", "text": "What is 2 + 2?"}]},
        ]
    }
    assert question_of(params) == "What is 2 + 2?"
    assert question_of({"input": "What is 3 + 3?"}) == "What is 3 + 3?"


def test_answer_row_is_deterministic() -> None:
    """The same row and policy give the same answer."""
    row = _seeded("What is 6 * 7?", 3)
    first = answer_row(row, agent="a", accuracy=0.7, policy_seed=1)
    assert answer_row(row, agent="a", accuracy=0.7, policy_seed=1) == first


def test_answer_rewards_vary_with_seed_and_follow_accuracy() -> None:
    """Rewards are 1.0 for the right answer, 0.0 otherwise, and vary with the seed."""
    rewards: Counter[float] = Counter()
    for seed in range(400):
        answer = answer_row(_seeded("What is 6 * 7?", seed), agent="a", accuracy=0.9, policy_seed=0)
        assert answer.reward == (1.0 if answer.text == "42" else 0.0)
        rewards[answer.reward] += 1
    assert rewards[1.0] > 100
    assert rewards[0.0] > 20


def test_answer_accuracy_zero_never_scores() -> None:
    """An agent with accuracy 0 never answers right."""
    hopeless = [
        answer_row(_seeded("What is 6 * 7?", s), agent="a", accuracy=0.0, policy_seed=0).reward
        for s in range(50)
    ]
    assert set(hopeless) == {0.0}


def test_answer_without_expected_answer_scores_zero() -> None:
    """A row without expected_answer is answered but never rewarded."""
    row = {"responses_create_params": {"input": "What is 1 + 1?"}}
    answer = answer_row(row, agent="a", accuracy=1.0, policy_seed=0)
    assert answer.reward == 0.0


def test_example_fixture_rows_are_well_formed() -> None:
    """About 40 flat rows, routed by task_source to the two agents, some identical, all
    solvable; then task rows of the taskset the demo routes to its episode server."""
    lines = (FIXTURES / "example_tasks.jsonl").read_bytes().splitlines()
    everything = [orjson.loads(line) for line in lines]
    rows = [row for row in everything if "task_id" not in row]
    tasks = [row for row in everything if "task_id" in row]
    assert 35 <= len(rows) <= 45
    assert len(set(lines)) < len(lines)
    assert len(tasks) == 8
    for task in tasks:
        assert set(task) == {"task_id", "task_input", "task_data"}
        assert task["task_id"]["taskset"] == "puzzles"
        assert solve(task["task_input"]["prompt"]) is not None
    for row in rows:
        assert "agent_ref" not in row
        assert row["task_source"] in {"math_agent", "string_agent"}  # the declaring instances
        assert solve(question_of(row["responses_create_params"])) == row["expected_answer"]


def test_write_tasks_is_deterministic_and_unique(tmp_path: Path) -> None:
    """The generator writes n solvable rows, the same for one seed, all distinct."""
    write_tasks(tmp_path / "a.jsonl", 300, seed=5)
    write_tasks(tmp_path / "b.jsonl", 300, seed=5)
    lines = (tmp_path / "a.jsonl").read_bytes().splitlines()
    assert (tmp_path / "b.jsonl").read_bytes() == (tmp_path / "a.jsonl").read_bytes()
    assert len(lines) == len(set(lines)) == 300
    kinds = Counter(
        orjson.loads(line)["responses_create_params"]["input"][0]["content"].split()[0]
        for line in lines
    )
    assert set(kinds) == {"What", "Reverse", "Convert", "How"}


def test_task_rows_duplicate_fraction_repeats_rows() -> None:
    """With a duplicate fraction some rows repeat earlier ones."""
    rows = [orjson.dumps(r) for r in task_rows(200, seed=1, duplicate_fraction=0.25)]
    assert 20 < len(rows) - len(set(rows)) < 80


def test_task_row_refuses_unknown_questions() -> None:
    """Only example question kinds can be turned into rows."""
    with pytest.raises(ValueError, match="not an example question"):
        task_row("Tell me a joke.")
