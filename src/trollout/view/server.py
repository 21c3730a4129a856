"""Serving the view: the JSON API, the page's three files and each run's HTML report.

One Trio task per connection (`trollout.httpserver`); the API's work (reading and indexing the
run files) runs in a worker thread, one request at a time under a lock, so the event loop keeps
accepting and the index is never read while it changes. Only ``GET`` is served, and only for a
``Host`` that names the address served (module doc of `trollout.view`).

Every reply carries headers that keep a run's data inert in the browser: a
Content-Security-Policy allowing the page's own script and style and nothing else (no inline
script, no other origin, no framing), ``nosniff``, no referrer, no caching. The HTML report (a
file of the run folder) is served sandboxed: no script runs in it, whatever it holds.
"""

from __future__ import annotations

import ipaddress
import socket
from importlib import resources
from pathlib import Path
from typing import Final

import orjson
import trio

from ..httpserver import Reply, Request, listen, serve_listener
from .api import ApiError, ViewApi
from .runs import open_run_file

__all__ = ["DEFAULT_PORT", "ViewServer", "is_loopback"]

DEFAULT_PORT: Final = 8765
_STATIC: Final = {
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/static/app.css": ("app.css", "text/css; charset=utf-8"),
}
_PAGE_PREFIXES: Final = ("/run/", "/compare/")
_SAFE: Final = (
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("cache-control", "no-store"),
    ("x-frame-options", "DENY"),
    ("cross-origin-resource-policy", "same-origin"),
)
_PAGE_POLICY: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_REPORT_POLICY: Final = (
    "sandbox; default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'none'"
)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address or ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _asset(name: str) -> bytes:
    return resources.files("trollout.view").joinpath("static", name).read_bytes()


class ViewServer:
    """The API and page of one ``trollout view``, on one listening socket."""

    def __init__(self, api: ViewApi, host: str = "127.0.0.1", port: int = DEFAULT_PORT) -> None:
        self.api = api
        self.host = host
        self.listener = _listen(host, port)
        self.port = self.listener.getsockname()[1]
        self._lock = trio.Lock()
        self._assets = {path: (_asset(name), kind) for path, (name, kind) in _STATIC.items()}
        self._page = _asset("index.html")
        names = {"127.0.0.1", "localhost", "[::1]", host, f"[{host}]"}
        self._hosts = {f"{name}:{self.port}" for name in names}
        self._any_host = not is_loopback(host)  # a user's explicit choice, warned about

    @property
    def url(self) -> str:
        """The URL to open (loopback hosts by name, others as given)."""
        shown = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{shown}:{self.port}/"

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled, indexing the runs in steps meanwhile.

        The first page is answered from the first step; the page shows that indexing goes on
        and follows it as it follows a live run.
        """
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_listener, self.listener, self.handle)
            task_status.started()
            behind = True
            while behind:
                async with self._lock:
                    behind = await trio.to_thread.run_sync(self.api.step)

    async def handle(self, request: Request) -> Reply:
        """Answer one request."""
        if request.method != "GET":
            return _error(405, "the view is read-only: only GET is served")
        if not self._any_host and request.headers.get("host", "") not in self._hosts:
            return _error(403, "this view answers only requests addressed to it by its host")
        path = request.path
        if path.startswith("/api/"):
            try:
                async with self._lock:
                    answer = await trio.to_thread.run_sync(self.api.answer, path, request.query)
            except ApiError as exc:
                return _error(exc.status, str(exc))
            body = orjson.dumps(answer)
            return _reply(200, body, "application/json")
        if path in self._assets:
            body, kind = self._assets[path]
            return _reply(200, body, kind)
        if path.startswith("/run/") and path.endswith("/report"):
            return await self._report(path)
        if path == "/" or path.startswith(_PAGE_PREFIXES):
            return _reply(200, self._page, "text/html; charset=utf-8")
        return _error(404, f"nothing here: {path[:100]!r}")

    async def _report(self, path: str) -> Reply:
        number = path.split("/")[2]
        runs = self.api.runs
        if not number.isdigit() or int(number) >= len(runs):
            return _error(404, "no such run")
        report = runs[int(number)].shards[0].report
        try:
            body = await trio.to_thread.run_sync(_read_report, report)
        except OSError:
            return _error(404, "the run has no HTML report yet (trollout aggregate writes it)")
        headers = (*_SAFE, ("content-security-policy", _REPORT_POLICY))
        return Reply(200, body, "text/html; charset=utf-8", headers)


def _read_report(path: Path) -> bytes:
    f = open_run_file(path)
    if f is None:
        raise FileNotFoundError(path)
    with f:
        return f.read(64 << 20)


def _listen(host: str, port: int) -> socket.socket:
    try:
        return listen(port, host=host, backlog=64)
    except OSError:
        if port == DEFAULT_PORT:  # the default is taken (another view): any free port
            return listen(0, host=host, backlog=64)
        raise


def _reply(status: int, body: bytes, kind: str) -> Reply:
    return Reply(status, body, kind, (*_SAFE, ("content-security-policy", _PAGE_POLICY)))


def _error(status: int, message: str) -> Reply:
    return _reply(status, orjson.dumps({"error": message}), "application/json")
