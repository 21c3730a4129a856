"""Synthetic datasets of the example task kinds, for tests and benchmarks.

Rows look like fixtures/example_tasks.jsonl: ``responses_create_params.input`` holds one user
message with an arithmetic or string question, ``expected_answer`` its answer, and no
``agent_ref`` (the run routes them). Questions embed the row number, so two rows are
identical only when ``duplicate_fraction`` makes a row repeat an earlier one.

`episode_task_rows` writes 0.7.0 materialized task rows instead, for episode servers::

    {"task_id": {"taskset": "arith", "task_id": "arith-00000"},
     "task_input": {"prompt": "What is 1 + 42?"},
     "task_data": {"_ng_digest": "sha256:...", "_ng_dataset_digest": "sha256:..."}}
"""

from __future__ import annotations

import hashlib
import os
import random
import string
from collections.abc import Iterator
from typing import Any

import orjson

from .policy import solve

__all__ = ["episode_task_rows", "task_row", "task_rows", "write_episode_tasks", "write_tasks"]


def _word(rng: random.Random, number: int) -> str:
    tag = ""
    while True:
        number, digit = divmod(number, 26)
        tag += string.ascii_lowercase[digit]
        if not number:
            break
    return "".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 5))) + tag


def _question(rng: random.Random, index: int) -> str:
    kind = rng.randrange(6)
    if kind < 3:
        op = "+-*"[kind]
        return f"What is {index + 1} {op} {rng.randint(1, 99)}?"
    word = _word(rng, index)
    if kind == 3:
        return f"Reverse the string '{word}'."
    if kind == 4:
        return f"Convert '{word}' to upper case."
    return f"How many times does '{rng.choice(word)}' appear in '{word}'?"


def task_row(question: str, *, system: str | None = None) -> dict[str, Any]:
    """Return a dataset row asking ``question``, with its ``expected_answer``."""
    answer = solve(question)
    if answer is None:
        raise ValueError(f"{question!r} is not an example question; see trollout.testing.policy")
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": question})
    return {"responses_create_params": {"input": messages}, "expected_answer": answer}


def task_rows(
    n_rows: int, seed: int = 0, *, duplicate_fraction: float = 0.0
) -> Iterator[dict[str, Any]]:
    """Yield ``n_rows`` synthetic rows, deterministically from ``seed``."""
    rng = random.Random(seed)
    earlier: list[str] = []
    for index in range(n_rows):
        if earlier and rng.random() < duplicate_fraction:
            question = rng.choice(earlier)
        else:
            question = _question(rng, index)
            if duplicate_fraction > 0:
                earlier.append(question)
        yield task_row(question)


def write_tasks(
    path: str | os.PathLike[str], n_rows: int, seed: int = 0, *, duplicate_fraction: float = 0.0
) -> None:
    """Write ``n_rows`` synthetic task rows to the JSONL file ``path``."""
    with open(path, "wb") as f:
        for row in task_rows(n_rows, seed, duplicate_fraction=duplicate_fraction):
            f.write(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))


def _sha256(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def episode_task_rows(n_rows: int, *, taskset: str, seed: int = 0) -> Iterator[dict[str, Any]]:
    """Yield ``n_rows`` distinct materialized task rows of ``taskset``, from ``seed``."""
    rng = random.Random(seed)
    dataset_digest = _sha256(f"{taskset}:{seed}:{n_rows}")
    for index in range(n_rows):
        prompt = _question(rng, index)
        yield {
            "task_id": {"taskset": taskset, "task_id": f"{taskset}-{index:05d}"},
            "task_input": {"prompt": prompt},
            "task_data": {"_ng_digest": _sha256(prompt), "_ng_dataset_digest": dataset_digest},
        }


def write_episode_tasks(
    path: str | os.PathLike[str], n_rows: int, *, taskset: str, seed: int = 0
) -> None:
    """Write ``n_rows`` materialized task rows of ``taskset`` to the JSONL file ``path``."""
    with open(path, "wb") as f:
        for row in episode_task_rows(n_rows, taskset=taskset, seed=seed):
            f.write(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))
