"""Fixtures of the view's tests: real runs collected from the fake deployment, a view server in
its own process, and Debian's chromium driven by playwright.

`collected` is one real collection with landed, failed (terminal) and retried (failed once,
then landed) rollouts, plus hostile rows: markup, a script and control characters in prompts
and in a failure class. `serve` starts ``trollout view ... --port 0 --no-browser`` and
reads the URL it prints. `chromium_session` installs chromium with apt when it is absent (we run
as root in CI and on the dev machines) and skips, with the reason, only when it truly cannot
start; a test reaches it through `browser` (or `page`).

Playwright's sync API runs its asyncio loop in a greenlet of the main thread and, between two
calls, leaves that loop marked as running in the thread (the loop is suspended mid-run, not
stopped). Left so for the whole session, every later ``asyncio.run`` in this process fails
("cannot be called from a running event loop": tests/nemo_gym does that). So the mark is
playwright's only while a browser test runs: `chromium_session` takes it off once chromium is
up, `browser` puts it back for one test and takes it off after, and the session's end puts it
back to shut playwright down. Rejected: playwright in a thread of its own (its objects may be
used only from the thread that made them, so every test would post its calls to that thread);
a browser per test module (a module still leaves the mark while it runs, and a new chromium
per module costs seconds); ordering the tests (a fix that holds in one order only).
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from view_kit import (
    ARGS,
    CHROMIUM,
    ViewProcess,
    collect,
    ensure_chromium,
    playwright_turn,
    task_rows,
)

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
def chromium_session() -> Iterator[tuple[Any, asyncio.AbstractEventLoop]]:
    """Debian's chromium, headless, with a fresh profile, driven by playwright: its browser
    context and playwright's loop, not marked running in this thread (module doc)."""
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
        loop = asyncio.get_running_loop()  # playwright's, marked running by its last call
        asyncio._set_running_loop(None)
        try:
            yield context, loop
        finally:
            with playwright_turn(loop):  # playwright stops with its loop marked, as it left it
                context.close()
                p.stop()


@pytest.fixture
def browser(chromium_session: tuple[Any, asyncio.AbstractEventLoop]) -> Iterator[Any]:
    """The session's chromium for one test, playwright's loop marked running meanwhile."""
    context, loop = chromium_session
    with playwright_turn(loop):
        yield context


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
