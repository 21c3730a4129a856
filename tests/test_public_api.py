"""The public surface: everything in __all__ exists and the embedding path works."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import trollout
from trollout.testing import open_fake_deployment


def test_public_api_exports_exist() -> None:
    """Every name in trollout.__all__ is importable from the package."""
    missing = [name for name in trollout.__all__ if not hasattr(trollout, name)]
    assert missing == []


def test_the_transport_has_one_name() -> None:
    """`Http11Transport` only: the alias from when it was h11 (`H11Transport`) is gone."""
    from trollout.collector.http import transport

    assert "Http11Transport" in trollout.__all__
    assert not hasattr(trollout, "H11Transport")
    assert not hasattr(transport, "H11Transport")


async def test_public_api_embedding_driver_collects_over_loopback(tmp_path: Any) -> None:
    """A driver plans rows in memory and collects them with the public API alone."""
    rows = [
        {
            "responses_create_params": {"input": [{"role": "user", "content": "What is 2 + 3?"}]},
            "expected_answer": "5",
        },
    ]
    async with open_fake_deployment() as fake:
        urls = dict(fake.agent_urls.items())
        deployment = trollout.Deployment.from_agent_urls(urls)
        config = trollout.RunConfig(agent_name="math_agent", num_repeats=3)
        plan = trollout.plan_rows(rows, config, deployment)
        async with trollout.open_collector(
            config=config, urls=urls, retain_outcomes=True
        ) as collector:
            await collector.collect(plan.rows())
            outcomes = collector.drain_nowait()
    assert plan.expected == 3
    assert sorted(o.identity.rollout_index for o in outcomes) == [0, 1, 2]
    assert all(isinstance(o, trollout.Landed) for o in outcomes)


# Named after the httpx timeout each one is (httpx.ReadTimeout), so `except httpx.ReadTimeout`
# readers recognise them; every other exception class of ours ends in ``Error``.
HTTPX_STYLE_TIMEOUTS = frozenset({"ReplyTimeout", "BodyReadTimeout", "BodyReplyTimeout"})
_EXCEPTION_SUFFIXES = ("Error", "Exception", "Timeout", "Warning", "Exit", "Interrupt")


def test_every_exception_class_name_ends_in_error() -> None:
    """Every exception class in src/trollout (private ones too) is named ``...Error``: a class
    is one when a base is a builtin or library exception, or another such class of ours."""
    src = Path(trollout.__file__).parent
    bases: dict[str, list[str]] = {}
    where: dict[str, str] = {}
    for path in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                names = [ast.unparse(b).rpartition(".")[2] for b in node.bases]
                bases[node.name] = names
                where[node.name] = f"{path.relative_to(src)}:{node.lineno}"
    exceptions: set[str] = set()
    grown = True
    while grown:
        found = {
            name
            for name, names in bases.items()
            if any(b.endswith(_EXCEPTION_SUFFIXES) or b in exceptions for b in names)
        }
        grown, exceptions = found > exceptions, exceptions | found
    assert {"TrolloutError", "ResponseBeganError", "BodyReadTimeout"} <= exceptions
    wrong = sorted(
        f"{where[name]} {name}"
        for name in exceptions - HTTPX_STYLE_TIMEOUTS
        if not name.endswith("Error")
    )
    assert wrong == []
