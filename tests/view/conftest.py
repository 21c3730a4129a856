"""Fixtures of the view's tests: real runs collected from the fake deployment, a view server in
its own process, and Debian's chromium driven by playwright.

`collected` is one real collection with landed, failed (terminal) and retried (failed once,
then landed) rollouts, plus hostile rows: markup, a script and control characters in prompts
and in a failure class. `serve` starts ``trollout view ... --port 0 --no-browser`` and
reads the URL it prints. `browser` installs chromium with apt when it is absent (we run as
root in CI and on the dev machines) and skips, with the reason, only when it truly cannot start.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from view_kit import ARGS, CHROMIUM, ViewProcess, collect, ensure_chromium, task_rows

from trollout.testing import AgentSpec, DeploymentSpec, spawn_fake_deployment


@pytest.fixture(scope="session")
def fake_deployment() -> Iterator[str]:
    """The fake deployment (one agent, ``math_agent``) for the whole session: its head URL."""
    spec = DeploymentSpec(agents=(AgentSpec(name="math_agent"),))
    with spawn_fake_deployment(spec) as urls:
        yield urls.head_url


@pytest.fixture(scope="session")
def collected(tmp_path_factory: pytest.TempPathFactory, fake_deployment: str) -> Path:
    """One real run (module doc): its output file."""
    return collect(tmp_path_factory.mktemp("run_a"), task_rows(), fake_deployment)


@pytest.fixture(scope="session")
def collected_b(tmp_path_factory: pytest.TempPathFactory, fake_deployment: str) -> Path:
    """The same tasks where task 0 fails terminally (so it differs from `collected`)."""
    rows = task_rows()
    rows[0]["fake_fault"] = {"kind": "failure_class", "failure_class": "b_only", "terminal": True}
    return collect(tmp_path_factory.mktemp("run_b"), rows, fake_deployment)


@pytest.fixture
def serve() -> Iterator[Callable[..., ViewProcess]]:
    """Start views; each is stopped at the end of the test."""
    started: list[ViewProcess] = []

    def start(*runs: str | Path) -> ViewProcess:
        view = ViewProcess([str(r) for r in runs])
        started.append(view)
        return view

    yield start
    for view in started:
        view.stop()


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """Debian's chromium, headless, with a fresh profile, driven by playwright."""
    try:
        from playwright.sync_api import Error, sync_playwright
    except ImportError as exc:  # the dev extra installs it
        pytest.skip(f"playwright is not installed ({exc}); pip install -e '.[dev]'")
    problem = ensure_chromium()
    if problem is not None:
        pytest.skip(problem)
    with sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
        try:
            context = p.chromium.launch_persistent_context(
                profile,
                executable_path=CHROMIUM,
                args=ARGS,
                viewport={"width": 1300, "height": 1000},
            )
        except Error as exc:
            pytest.skip(f"chromium cannot start here: {str(exc).splitlines()[0]}")
        context.set_default_timeout(30_000)
        yield context
        context.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh tab; it fails the test on any script error or console error."""
    tab = browser.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda e: errors.append(str(e)))
    tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    yield tab
    tab.close()
    assert errors == []
