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

Values from the environment: a served config may take a server's host or port from an
environment variable the user allowed (`collector.served_config`); the value is used to connect
and never shown. `conceal` registers such a URL with its interpolation text, and `concealed`
(which `public_url` applies) writes ``${oc.env:HEAD_HOST}`` where the host or the URL's
host:port would appear. The register is per process and only grows: a value once concealed
stays concealed, whichever run, thread or message shows it. Every place that shows a server URL
or an error naming one passes it through `public_url` or `concealed`.

Design note: backslashes are left as they are rather than doubled as ``repr`` would, so paths
and names stay readable; the output holds no control character either way, which makes
`visible` idempotent (escaping twice is harmless where a printer escapes a whole line).
"""

from __future__ import annotations

import threading
from typing import Final
from urllib.parse import urlsplit

__all__ = ["conceal", "concealed", "has_control", "public_url", "visible"]

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
    URL carries a secret (``?api_key=...``), and spans and labels leave the machine. A host or
    port read from the environment shows as its interpolation text (`conceal`).
    """
    parts = urlsplit(url)
    return concealed(f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}")


# (real text, shown text), longest real text first; replaced as a whole, in this order.
_CONCEALED: list[tuple[str, str]] = []
_CONCEALED_LOCK: Final = threading.Lock()
_SHORTEST_BARE: Final = 4  # a shorter host is concealed within host:port only


def conceal(url: str, host: str | None, port: str | None) -> None:
    """Show ``url``'s host (and its host:port) by the texts given from now on.

    Args:
        url: ``http://host:port`` as trollout connects to it.
        host: the host's interpolation text, or None when the host is not concealed.
        port: the port's interpolation text, or None when the port is not concealed.
    """
    parts = urlsplit(url)
    real_host, real_port = parts.netloc.rpartition(":")[0], str(parts.port)
    shown_host = host if host is not None else real_host
    shown_port = port if port is not None else real_port
    pairs = [(f"{real_host}:{real_port}", f"{shown_host}:{shown_port}")]
    bare = real_host.strip("[]")
    if host is not None and len(bare) >= _SHORTEST_BARE:  # "db" alone would garble messages
        pairs += [(real_host, shown_host), (bare, shown_host), (bare.lower(), shown_host)]
    with _CONCEALED_LOCK:
        known = dict(_CONCEALED)
        known.update((real, shown) for real, shown in pairs if real)
        _CONCEALED[:] = sorted(known.items(), key=lambda pair: -len(pair[0]))


def concealed(text: str) -> str:
    """Return ``text`` with every concealed host and host:port shown by its interpolation text."""
    for real, shown in _CONCEALED:
        if real in text:
            text = text.replace(real, shown)
    return text
