"""NeMo Gym's prompt_config and per-agent num_repeats_add_seed in the plan."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from plan_router import direct_router

from builders import without_hanging
from trollout.collector.planning.plan import plan_rollouts
from trollout.collector.planning.prompts import MAX_PROMPT_BYTES
from trollout.errors import ConfigError, InputError
from trollout.settings import RunConfig


def write(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Write rows as JSONL."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def prompt_file(tmp_path: Path, text: str) -> str:
    """Write a prompt YAML file; return its path."""
    path = tmp_path / "prompt.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_prompt_config_builds_input_from_row_fields(tmp_path: Path) -> None:
    """The template fills {fields} from the row; other responses_create_params stay."""
    prompt = prompt_file(tmp_path, 'system: "Answer {{briefly}}."\nuser: "Solve: {question}"\n')
    rows = [
        {"question": "1+1", "responses_create_params": {"temperature": 0.5}},
        {"question": "2+2"},
    ]
    config = RunConfig(prompt_config=prompt, agent_name="alpha")
    plan = plan_rollouts(write(tmp_path / "in.jsonl", rows), config, direct_router())
    bodies = [dict(r.body) for r in plan.rows()]
    assert bodies[0]["responses_create_params"] == {
        "temperature": 0.5,
        "input": [
            {"role": "system", "content": "Answer {briefly}."},
            {"role": "user", "content": "Solve: 1+1"},
        ],
    }
    assert bodies[1]["responses_create_params"]["input"][1]["content"] == "Solve: 2+2"
    assert bodies[1]["question"] == "2+2"


def test_prompt_config_refuses_rows_with_input_or_missing_fields(tmp_path: Path) -> None:
    """A row that has an input, or lacks a placeholder's field, is refused before anything."""
    prompt = prompt_file(tmp_path, "user: 'Solve: {question}'\n")
    rows = [{"question": "x", "responses_create_params": {"input": "given"}}, {"other": 1}]
    config = RunConfig(prompt_config=prompt, agent_name="alpha")
    with pytest.raises(InputError) as info:
        plan_rollouts(write(tmp_path / "in.jsonl", rows), config, direct_router())
    problems = list(info.value.problems)
    assert "mutually exclusive" in problems[0]
    assert "has no field 'question'" in problems[1]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("system: hi\n", "must be a mapping with a 'user' template"),
        ("user: hi\nassistant: x\n", "unknown key 'assistant'"),
        ("user: 'bad {'\n", "not a valid format string"),
        ("user: 'first {}'\n", "positional placeholder"),
    ],
)
def test_prompt_config_refuses_bad_files(tmp_path: Path, text: str, message: str) -> None:
    """A prompt file that is not NeMo Gym's shape is a config error naming the file."""
    config = RunConfig(prompt_config=prompt_file(tmp_path, text), agent_name="alpha")
    source = write(tmp_path / "in.jsonl", [{"q": 1}])
    with pytest.raises(ConfigError, match=message):
        plan_rollouts(source, config, direct_router())
    missing = RunConfig(prompt_config=str(tmp_path / "nope.yaml"), agent_name="alpha")
    with pytest.raises(ConfigError, match="cannot read prompt_config"):
        plan_rollouts(source, missing, direct_router())


def seeded_agents(tmp_path: Path, add_seed: Any) -> dict[str, bool]:
    """Plan one row for alpha and one for beta; return which agents' rows carry a seed."""
    rows = [
        {"responses_create_params": {"input": "a"}, "agent_ref": {"name": "alpha"}},
        {"responses_create_params": {"input": "b"}, "agent_ref": {"name": "beta"}},
    ]
    config = RunConfig(num_repeats_add_seed=add_seed)
    plan = plan_rollouts(write(tmp_path / "in.jsonl", rows), config, direct_router())
    return {
        str(r.identity.agent_name): "metadata" in r.body["responses_create_params"]
        for r in plan.rows()
    }


def test_num_repeats_add_seed_per_agent(tmp_path: Path) -> None:
    """A mapping seeds the agents it says, others by _default (absent: no seed)."""
    assert seeded_agents(tmp_path, {"alpha": False}) == {"alpha": False, "beta": False}
    assert seeded_agents(tmp_path, {"alpha": False, "_default": True}) == {
        "alpha": False,
        "beta": True,
    }
    assert seeded_agents(tmp_path, True) == {"alpha": True, "beta": True}


def test_prompt_config_fifo_refused_without_opening_it(tmp_path: Path) -> None:
    """A FIFO as prompt_config is refused by its kind; it is never opened, so nothing blocks."""
    fifo = tmp_path / "prompt.yaml"
    os.mkfifo(fifo)
    config = RunConfig(prompt_config=str(fifo), agent_name="alpha")
    source = write(tmp_path / "in.jsonl", [{"q": 1}])

    def plan() -> str:
        with pytest.raises(ConfigError) as info:
            plan_rollouts(source, config, direct_router())
        return str(info.value)

    message = without_hanging(plan, fifo)
    assert message == (
        f"{fifo}: prompt_config is a pipe or FIFO, not a regular file; save the prompt "
        "template to a file and pass that"
    )


def test_prompt_config_larger_than_the_bound_refused_naming_it(tmp_path: Path) -> None:
    """A prompt file past MAX_PROMPT_BYTES (1 MiB) is refused after reading only the bound."""
    assert MAX_PROMPT_BYTES == 1 << 20
    path = tmp_path / "prompt.yaml"
    path.write_text("user: '" + "x" * (MAX_PROMPT_BYTES - 9) + "'\n")  # exactly the bound
    config = RunConfig(prompt_config=str(path), agent_name="alpha")
    source = write(tmp_path / "in.jsonl", [{"q": 1}])
    assert plan_rollouts(source, config, direct_router()).expected == 1
    with open(path, "ab") as f:
        f.truncate(MAX_PROMPT_BYTES + 1)  # one byte more (a NUL: the read stops before YAML)
    with pytest.raises(ConfigError) as info:
        plan_rollouts(source, config, direct_router())
    assert str(info.value) == (
        f"prompt_config {str(path)!r} is larger than 1,048,576 bytes (the prompt file limit); "
        "a prompt template is a small YAML file: check the path"
    )
