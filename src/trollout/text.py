"""Text from outside (servers, files, configs) made harmless on a terminal.

Any string trollout did not write itself is data: a failure class, a kind or message from a
server, an agent or server name, a path, a config key. Shown raw, its control characters act on
the user's terminal: ESC starts ANSI and OSC sequences that recolour, retitle or rewrite it,
U+009B is ESC ``[`` on some terminals, CR and BS overwrite what was printed, bidirectional
overrides reorder a line. `visible` replaces each with the escape ``repr`` writes for it
(``\\x1b``, ``\\r``, ``\\x9b``, ``\\u202e``), so the text still reads as sent and does nothing.

Rich markup is the other half and is handled structurally, not here: printers hand rich only
`rich.text.Text` objects, never a string its markup parser would read (`metrics.report_text`,
`cli.progress`), and the HTML report escapes through `visible` then `html.escape`.

Design note: backslashes are left as they are rather than doubled as ``repr`` would, so paths
and names stay readable; the output holds no control character either way, which makes
`visible` idempotent (escaping twice is harmless where a printer escapes a whole line).
"""

from __future__ import annotations

from typing import Final
from urllib.parse import urlsplit

__all__ = ["has_control", "public_url", "visible"]

# C0 (tab and newline included: one datum never spans lines), DEL, C1, the line and paragraph
# separators, and the bidirectional marks, embeddings, overrides and isolates.
_CONTROL: Final = (
    *range(0x00, 0x20),
    *range(0x7F, 0xA0),
    *(0x061C, 0x200E, 0x200F, 0x2028, 0x2029),
    *range(0x202A, 0x202F),
    *range(0x2066, 0x206A),
)
_ESCAPES: Final = {code: repr(chr(code))[1:-1] for code in _CONTROL}


def visible(text: str) -> str:
    """Return ``text`` with every control character shown as its escape.

    ESC becomes the four characters ``\\x1b``, CR becomes ``\\r``; everything else is kept.
    """
    return text.translate(_ESCAPES)


def has_control(text: str) -> bool:
    """Whether ``text`` holds any character `visible` would escape (a newline, ESC, ...)."""
    return visible(text) != text


def public_url(url: str) -> str:
    """Return `url` as ``scheme://host:port/path``: what telemetry and messages may show.

    ``user:password@``, the ``?query`` and the ``#fragment`` are dropped: they are where a
    URL carries a secret (``?api_key=...``), and spans and labels leave the machine.
    """
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"
