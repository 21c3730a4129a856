"""The echo check: whether a 200 reply echoes what this request sent, or another's.

`expected_echo` lists what a request's reply may echo only unchanged (the identity stamps, or an
episode's ``episode_id`` and ``task_id``, and the input); `echo_mismatches` returns what a reply
echoes otherwise, and `outcomes` turns a mismatch into `identity_mismatch` (its design note on
forged and foreign replies says why the check exists).

The input echo. NeMo Gym agents and 0.7.0 environment servers echo the request's
``responses_create_params`` in their reply, after their request model has validated it: each
input item gains the model's defaults (``type: message``, ``phase: null``; a string input may
come back as one user message, string content as a list of text parts), so the echo is not the
bytes sent. What the model never changes is the conversation: each item's role and text. The
check therefore compares the two inputs as lists of ``(role, texts)`` (`conversation`; an item
without a role, a tool call or its output, counts by its ``type``), and fails a reply whose
conversation is another one. It is what catches a stray reply against servers that echo no
identity (0.7.0 environment servers' replies to flat rows): a forged or replayed reply carries
the input of the request it answered. A reply that echoes no ``responses_create_params`` (or one
without ``input``) passes: not every agent echoes. An agent that rewrites its input (adds a
system prompt, summarises the history) would fail every rollout; ``check_echoed_input: false``
(``DispatchPolicy.check_echoed_input``) turns the input check off, and the identity checks stay.
Its cost is on every 200: an ``==`` of the two inputs, which answers at once when the echo is
verbatim, else one walk of each (a few dicts per message). Rejected alternatives: comparing the
whole ``responses_create_params`` (an agent fills in ``model``, ``tools`` defaults, ``metadata``
merges: every real reply would fail); comparing a digest of the input (the echo is not the bytes
sent, and the conversation view is as cheap as hashing it).

What remains: a stray reply that echoes neither identity nor input, or whose input is the same
as the next request's (another repeat of one task), and that arrives after the next request was
written (in the microseconds between the checkout poll and the write, or while the request is in
flight), is indistinguishable from that request's reply, and is taken as it. No mechanism at the
HTTP level can tell them apart; closing every connection after one request would, at a TCP
connect per rollout. The episode protocol (docs/protocol.md section 3) makes the ``episode_id`` and
``task_id`` echo mandatory, which closes the gap for episodes through the same `echo_mismatches`
(`expected_echo` of an episode request): there a wrong echo is the server's protocol violation
(`episodes`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from ... import records

__all__ = [
    "ECHOED_IDENTITY_KEYS",
    "ECHOED_PARAMS",
    "conversation",
    "echo_mismatches",
    "expected_echo",
    "json_type",
    "same_input",
    "same_json",
]

ECHOED_IDENTITY_KEYS: Final = (
    records.TASK_INDEX,
    records.ROLLOUT_INDEX,
    records.ATTEMPT_INDEX,
    records.ROLLOUT_ID,
)
"""The request keys a reply may echo back; an echo must carry the value that was sent."""
ECHOED_PARAMS: Final = "responses_create_params"
"""The request key whose ``input`` a reply may echo only as the same conversation."""


def expected_echo(request: Mapping[str, Any], *, check_input: bool = True) -> list[tuple[str, Any]]:
    """Return the (key, value sent) pairs of `request` that a reply may echo only unchanged.

    For an episode request, the ``episode_id`` and the task's ``task_id`` (docs/protocol.md
    section 3); for a flat row, the identity keys it carries and, with `check_input`, its
    ``responses_create_params`` when that holds an ``input`` (compared as a conversation: the
    module's design note).
    """
    if "episode_id" in request:
        return [("episode_id", request["episode_id"]), ("task_id", request["task"]["task_id"])]
    echo = [(key, request[key]) for key in ECHOED_IDENTITY_KEYS if key in request]
    if check_input:
        params = request.get(ECHOED_PARAMS)
        if type(params) is dict and "input" in params:
            echo.append((ECHOED_PARAMS, params))
    return echo


def echo_mismatches(
    reply: Mapping[str, Any], expected: Iterable[tuple[str, Any]]
) -> list[tuple[str, Any, Any]]:
    """Return (key, sent, echoed) for each expected key that `reply` echoes with another value.

    Values compare as JSON, types included (`same_json`); ``responses_create_params`` compares
    by the conversation of its ``input`` (`same_input`). A key the reply leaves out is no
    contradiction: servers need not echo (an episode reply must, which `episodes` checks first).
    """
    return [
        (key, sent, reply[key])
        for key, sent in expected
        if key in reply
        and not (
            _same_params(reply[key], sent) if key == ECHOED_PARAMS else same_json(reply[key], sent)
        )
    ]


def _same_params(echoed: Any, sent: Mapping[str, Any]) -> bool:
    """Return whether an echoed ``responses_create_params`` holds the input that was sent.

    An echo that is no mapping, or has no ``input``, shows nothing to compare: it passes.
    """
    if type(echoed) is not dict or "input" not in echoed:
        return True
    return same_input(echoed["input"], sent["input"])


def same_input(echoed: Any, sent: Any) -> bool:
    """Return whether two ``responses_create_params.input`` values are one conversation.

    Each item's role and text are compared, not the defaults a server's request model adds
    (the module's design note): ``[{"role": "user", "content": "hi", "type": "message"}]``
    is the same input as ``"hi"``.
    """
    return echoed == sent or conversation(echoed) == conversation(sent)


def conversation(value: Any) -> tuple[Any, ...]:
    """Return an input as ``(role, texts)`` per message (``(None, type)`` for other items)."""
    if type(value) is str:
        return (("user", (value,)),)
    if type(value) is not list:
        return ((None, value),)
    return tuple(
        (item["role"], _texts(item.get("content")))
        if type(item) is dict and "role" in item
        else (None, item.get("type") if type(item) is dict else item)
        for item in value
    )


def _texts(content: Any) -> tuple[Any, ...]:
    """Return a message content's texts: the string, or each text part's ``text``."""
    if type(content) is not list:
        return () if content is None else (content,)
    return tuple(
        part["text"] if type(part) is dict else part
        for part in content
        if type(part) is not dict or type(part.get("text")) is str
    )


def json_type(value: object) -> str:
    """Return the JSON type name of a decoded value (object, array, string, ...)."""
    names = {
        dict: "object",
        list: "array",
        str: "string",
        bool: "boolean",
        int: "number",
        float: "number",
    }
    return names.get(type(value), "null")


def same_json(a: object, b: object) -> bool:
    """Return whether two decoded JSON values are equal, types included (``true`` is not ``1``)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        assert isinstance(b, dict)
        return a.keys() == b.keys() and all(same_json(value, b[key]) for key, value in a.items())
    if isinstance(a, list):
        assert isinstance(b, list)
        return len(a) == len(b) and all(map(same_json, a, b))
    return a == b
