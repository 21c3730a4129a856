"""`trollout.text.visible`: external text shown on a terminal does nothing but read."""

from __future__ import annotations

import pytest

from trollout.text import visible


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("a\x1b[31mred", "a\\x1b[31mred"),  # ANSI colour (CSI)
        ("t\x1b]0;pwned\x07", "t\\x1b]0;pwned\\x07"),  # OSC: set the window title
        ("c\x9bq", "c\\x9bq"),  # C1 CSI
        ("r\rx", "r\\rx"),  # carriage return overwrites the line
        ("a\nb\tc\x00\x08\x7f", "a\\nb\\tc\\x00\\x08\\x7f"),  # C0 and DEL, newline included
        ("abc\u202egpj.exe", "abc\\u202egpj.exe"),  # a bidirectional override
    ],
)
def test_visible_escapes_control_characters(raw: str, shown: str) -> None:
    """Every control character becomes the escape repr writes for it."""
    assert visible(raw) == shown


@pytest.mark.parametrize(
    "text", ["oops[/bold]", "judge_failed[timeout]", "C:\\runs\\a", "naïve 数据 😀", ""]
)
def test_visible_keeps_printable_text(text: str) -> None:
    """Printable text, markup-looking brackets and backslashes are kept as they are."""
    assert visible(text) == text


def test_visible_is_idempotent() -> None:
    """Escaping twice changes nothing: the output holds no control character."""
    raw = "".join(chr(c) for c in range(0x00, 0xA0)) + "\u2028\u2066"
    once = visible(raw)
    assert visible(once) == once
    assert once.isprintable()
