"""The fake agents' answering policy: deterministic, seeded, sometimes wrong.

The example tasks ask arithmetic or string questions (``What is 17 + 25?``, ``Reverse the
string 'hello'.``). The policy solves the question it can parse (else it falls back on the
row's ``expected_answer``, as an oracle would), then decides whether to answer correctly with a
probability that depends on the agent's accuracy and the task's difficulty; the draw is a hash
of (policy seed, agent, question, rollout seed), where the rollout seed is the ``seed`` inside
``responses_create_params.metadata.extra_body`` (a JSON string), else the rollout index. So the
same row always gets the same reply, and rewards vary across seeds and tasks.

An episode server's task (``task_input: {"prompt": ..., "expected_answer"?: ...}``) is answered
by the same policy (`answer_task`), seeded by the rollout index of its episode id.

A row's ``fake_reward`` field (a number) is the reward its answers get, whatever they say: a
buggy grader (``1e308``, a negative reward) for tests of what scoring does with one.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from attrs import frozen

from .faults import unit_hash

__all__ = [
    "MODEL_ID",
    "Answer",
    "answer_row",
    "answer_task",
    "build_response",
    "question_of",
    "seed_of",
    "solve",
]

CREATED_AT = 1700000000.0
MODEL_ID = "fake-model"

_ARITHMETIC = re.compile(r"what is (-?\d+) *([-+*]) *(-?\d+)\??", re.IGNORECASE)
_REVERSE = re.compile(r"reverse the string '([^']*)'", re.IGNORECASE)
_UPPER = re.compile(r"convert '([^']*)' to upper ?case", re.IGNORECASE)
_LENGTH = re.compile(r"how many (?:letters|characters) are in '([^']*)'", re.IGNORECASE)
_COUNT = re.compile(r"how many times does '([^']*)' appear in '([^']*)'", re.IGNORECASE)


def solve(question: str) -> str | None:
    """Return the correct answer to an example question, or None if it is not one."""
    if m := _ARITHMETIC.search(question):
        a, op, b = int(m[1]), m[2], int(m[3])
        return str(a + b if op == "+" else a - b if op == "-" else a * b)
    if m := _REVERSE.search(question):
        return m[1][::-1]
    if m := _UPPER.search(question):
        return m[1].upper()
    if m := _LENGTH.search(question):
        return str(len(m[1]))
    if m := _COUNT.search(question):
        return str(m[2].count(m[1]))
    return None


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        ]
    return []


def _messages(params: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    raw = params.get("input")
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if isinstance(raw, list):
        return [m for m in raw if isinstance(m, Mapping)]
    return []


def _question(messages: list[Mapping[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role", "user") == "user":
            return " ".join(_texts(message.get("content")))
    return ""


def question_of(params: Mapping[str, Any]) -> str:
    """Return the text of the last user message of ``responses_create_params``."""
    return _question(_messages(params))


def seed_of(row: Mapping[str, Any]) -> int:
    """Return the rollout seed: ``metadata.extra_body``'s ``seed``, else the rollout index."""
    metadata = row["responses_create_params"].get("metadata")
    extra = metadata.get("extra_body") if isinstance(metadata, Mapping) else None
    if isinstance(extra, str):
        try:
            extra = json.loads(extra)
        except ValueError:
            extra = None
    if isinstance(extra, Mapping) and isinstance(extra.get("seed"), int):
        return int(extra["seed"])
    rollout = row.get("_ng_rollout_index", 0)
    return rollout if isinstance(rollout, int) else 0


REWARD_FIELD = "fake_reward"  # a row field: the reward its answers get (module docstring)


@frozen
class Answer:
    """What the policy answered and how it scored."""

    text: str
    reward: float
    input_tokens: int
    output_tokens: int
    key: str  # a hex digest of the draw, for response and message ids


def _wrong(answer: str, draw: float) -> str:
    if answer.lstrip("-").isdigit():
        return str(int(answer) + 1 + int(draw * 9))
    flipped = answer[::-1]
    return flipped if flipped != answer else answer + "?"


@functools.lru_cache(maxsize=1 << 16)
def _facts(question: str, expected: str | None) -> tuple[str, float]:
    """Return the true answer to ``question`` and its difficulty in [0, 1) (cached)."""
    truth = solve(question) or (expected if expected is not None else "I don't know")
    return truth, unit_hash("difficulty", question)


def answer_row(row: Mapping[str, Any], *, agent: str, accuracy: float, policy_seed: int) -> Answer:
    """Answer one row as ``agent`` would; the result depends only on its arguments."""
    messages = _messages(row["responses_create_params"])
    question = _question(messages)
    raw = row.get("expected_answer")
    expected = None if raw is None else str(raw).strip()
    truth, difficulty = _facts(question, expected)
    parts = (policy_seed, agent, question, seed_of(row))
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=20).digest()
    draw = int.from_bytes(digest[:8], "big") / 2.0**64
    text = truth if draw < accuracy * (1.0 - 0.5 * difficulty) else _wrong(truth, draw)
    reward = 1.0 if text.strip() == expected else 0.0
    forced = row.get(REWARD_FIELD)
    if isinstance(forced, int | float) and not isinstance(forced, bool):
        reward = float(forced)
    words = sum(len(t.split()) for m in messages for t in _texts(m.get("content")))
    return Answer(text, reward, 8 + words * 2, 4 + len(text) // 3, digest.hex())


def build_response(row: Mapping[str, Any], answer: Answer, *, model: str) -> dict[str, Any]:
    """Return an OpenAI Responses-like object carrying ``answer``."""
    params = row["responses_create_params"]
    key = answer.key
    usage = {
        "input_tokens": answer.input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": answer.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": answer.input_tokens + answer.output_tokens,
    }
    message = {
        "id": f"msg_{key}",
        "content": [
            {"annotations": [], "text": answer.text, "type": "output_text", "logprobs": []}
        ],
        "role": "assistant",
        "status": "completed",
        "type": "message",
    }
    return {
        "id": f"resp_{key}",
        "created_at": CREATED_AT,
        "error": None,
        "incomplete_details": None,
        "metadata": params.get("metadata"),
        "model": model,
        "object": "response",
        "output": [message],
        "parallel_tool_calls": True,
        "status": "completed",
        "tool_choice": "auto",
        "tools": params.get("tools") or [],
        "usage": usage,
    }


def task_params(task_input: Any) -> dict[str, Any]:
    """Return the ``responses_create_params`` an episode's ``task_input`` stands for."""
    prompt = task_input.get("prompt") if isinstance(task_input, Mapping) else None
    return {"input": [{"role": "user", "content": prompt if isinstance(prompt, str) else ""}]}


def answer_task(
    task_input: Any, *, server: str, accuracy: float, policy_seed: int, seed: int
) -> dict[str, Any]:
    """Return an episode server's ``result`` for one task: response, reward, components."""
    params = task_params(task_input)
    expected = task_input.get("expected_answer") if isinstance(task_input, Mapping) else None
    if expected is None:
        expected = solve(question_of(params))
    row = {
        "responses_create_params": params,
        "expected_answer": expected,
        "_ng_rollout_index": seed,
    }
    answer = answer_row(row, agent=server, accuracy=accuracy, policy_seed=policy_seed)
    return {
        "response": build_response(row, answer, model=MODEL_ID),
        "reward": answer.reward,
        "reward_components": {"exact_match": answer.reward},
        "terminated": True,
    }
