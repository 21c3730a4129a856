"""The view in a real browser: Debian's chromium, headless, driven by playwright.

Each test opens pages of a ``trollout view`` in its own process over runs collected from the
fake deployment, and waits on what the page shows (never on time). The `page` fixture fails a
test on any script error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from view_kit import HOSTILE_CLASS, HOSTILE_PROMPT, ViewProcess, playwright_turn

Serve = Callable[..., ViewProcess]


def rows(page: Any) -> Any:
    return page.locator("[data-testid=rollout-row]")


def test_run_page_shows_landed_failed_and_retried_and_filters_to_failures(
    collected: Path, serve: Serve, page: Any
) -> None:
    view = serve(collected)
    page.goto(view.url)  # one run: the home page opens its run page
    page.wait_for_url("**/run/0")
    page.locator("#matched[data-matched='8']").wait_for()
    assert rows(page).count() == 8
    assert page.locator("#count-landed").inner_text() == "6 of 8"
    assert page.locator("#count-failed").inner_text() == "2"
    retried = page.locator("[data-testid=rollout-row][data-id='0/5/0'] td").nth(6)
    assert retried.inner_text() == "2"  # attempts
    assert "boom_class" in page.locator("#summary").inner_text()
    assert "pass@1" in page.locator("#metrics").inner_text()
    page.select_option("select[name=outcome]", "failed")
    page.locator("#matched[data-matched='2']").wait_for()
    outcomes = page.locator("[data-testid=rollout-row] td:nth-child(5)").all_inner_texts()
    assert outcomes == ["failed", "failed"]
    assert "outcome=failed" in page.url  # the filtered table has its own URL


def test_rollout_page_by_url_shows_the_answer_and_the_failure_class(
    collected: Path, serve: Serve, page: Any
) -> None:
    view = serve(collected)
    page.goto(view.url + "run/0/rollout/0/5/0")  # the retried rollout, by its URL
    page.locator("#output").wait_for()
    assert "42" in page.locator("#output").inner_text()
    assert "What is 30 + 12?" in page.locator("#prompt").inner_text()
    attempts = page.locator("#attempts").inner_text()
    assert "agent_run_error" in attempts
    assert "landed" in attempts
    page.goto(view.url + "run/0/rollout/0/4/0")
    page.locator("#failure-class").wait_for()
    assert page.locator("#failure-class").inner_text() == "boom_class"
    page.locator("button[data-src='failure:0']").click()
    page.locator("#raw pre").wait_for()
    assert '"_ng_failure_class": "boom_class"' in page.locator("#raw pre").inner_text()


def test_long_field_is_cut_and_show_more_brings_the_rest(
    collected: Path, serve: Serve, page: Any
) -> None:
    view = serve(collected)
    page.goto(view.url + "run/0/rollout/0/7/0")
    page.locator("#prompt button.more").wait_for()
    before = len(page.locator("#prompt").inner_text())
    page.locator("#prompt button.more").click()
    page.locator("#prompt button.more").wait_for(state="detached")
    assert len(page.locator("#prompt").inner_text()) > before


def test_a_run_in_progress_gains_rows_without_a_reload(
    collected: Path, serve: Serve, page: Any, tmp_path: Path
) -> None:
    """A folder written as a collector writes it (appends): the open page follows it."""
    lines = collected.read_bytes().splitlines(keepends=True)
    out = tmp_path / "live" / "r.jsonl"
    out.parent.mkdir()
    out.write_bytes(lines[0])
    view = serve(out)
    page.goto(view.url + "run/0")
    page.locator("#matched[data-matched='1']").wait_for()
    assert page.locator("#live").is_visible()
    with open(out, "ab") as f:
        f.write(b"".join(lines[1:3]))
    page.locator("#matched[data-matched='3']").wait_for()
    with open(out, "ab") as f:
        f.write(b"".join(lines[3:]))
    page.locator(f"#matched[data-matched='{len(lines)}']").wait_for()
    assert rows(page).count() == len(lines)


def test_two_runs_side_by_side(collected: Path, collected_b: Path, serve: Serve, page: Any) -> None:
    view = serve(collected, collected_b)
    page.goto(view.url)
    page.locator("[data-testid=compare-link]").click()
    page.wait_for_url("**/compare/0/1*")
    first = page.locator("[data-testid=compare-row]").first
    first.wait_for()
    assert first.get_attribute("data-task") == "0"
    assert "differs" in (first.get_attribute("class") or "")
    links = first.locator("a.chip")
    assert links.count() == 2  # one rollout of task 0 in each run
    assert links.nth(0).get_attribute("href") == "/run/0/rollout/0/0/0"
    assert links.nth(1).get_attribute("href") == "/run/1/rollout/0/0/0"
    links.nth(1).click()
    page.locator("#failure-class").wait_for()
    assert page.locator("#failure-class").inner_text() == "b_only"


def test_markup_scripts_and_control_characters_render_as_text(
    collected: Path, serve: Serve, page: Any
) -> None:
    """A row holding a script, an image with onerror and control characters: shown as text,
    no element made from it, no script run (``window.__pwned`` stays unset)."""
    view = serve(collected)
    page.goto(view.url + "run/0?class=" + HOSTILE_CLASS.replace("=", "%3D").replace(" ", "%20"))
    page.locator("#matched[data-matched='1']").wait_for()
    assert HOSTILE_CLASS in page.locator("#rollouts").inner_text()
    page.goto(view.url + "run/0/rollout/0/6/0")
    page.locator("#prompt").wait_for()
    shown = page.locator("#prompt").inner_text()
    assert "<script>window.__pwned = 1</script>" in shown
    assert '<img src=x onerror="window.__pwned = 2">' in shown
    assert "\\x1b[31mred" in shown  # ESC shown as its escape
    assert "\\u202eevil" in shown  # a bidi override too
    assert "\x1b" not in shown
    assert page.locator("#failure-class").inner_text() == HOSTILE_CLASS
    assert page.locator("main script, main img").count() == 0  # no element from the data
    assert page.evaluate("window.__pwned") is None
    assert HOSTILE_PROMPT.startswith("<script>")


def test_between_browser_tests_asyncio_run_works(
    chromium_session: tuple[Any, asyncio.AbstractEventLoop], collected: Path, serve: Serve
) -> None:
    """With the session's chromium up, this thread runs no asyncio loop outside a browser test:
    ``asyncio.run`` works (tests/nemo_gym calls it, in whatever order the tests run), and the
    browser works after it."""

    async def answer() -> str:
        await asyncio.sleep(0)
        return "ran"

    assert asyncio.run(answer()) == "ran"
    context, loop = chromium_session
    view = serve(collected)
    with playwright_turn(loop):
        tab = context.new_page()
        try:
            tab.goto(view.url + "run/0")
            rows(tab).first.wait_for()
        finally:
            tab.close()
