"""``trollout view RUN [RUN ...]``: the rollout browser (`trollout.view`), from the command line.

It resolves the runs (an error names the argument, exit 2), indexes them, prints the URL on one
line (``trollout view: http://127.0.0.1:8765/ ...``; tests and scripts read it), opens the
browser unless ``--no-browser``, and serves until interrupted. A host that is not loopback
serves the runs' rollouts to the network: allowed, as an explicit choice, with a warning.
"""

from __future__ import annotations

import shlex
import webbrowser
from collections.abc import Sequence
from pathlib import Path

import click
import trio

from ..errors import ConfigError
from ..view.api import ViewApi
from ..view.runs import resolve_runs
from ..view.server import DEFAULT_PORT, ViewServer, is_loopback
from .failures import fail, run_trio

__all__ = ["view", "view_command"]


def view_command(*outputs: str | Path) -> str:
    """The command that opens the view of the runs whose output files are ``outputs``."""
    return "trollout view " + " ".join(shlex.quote(str(output)) for output in outputs)


@click.command()
@click.argument("runs", nargs=-1, required=True, metavar="RUN [RUN ...]")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to serve on.")
@click.option(
    "--port",
    default=DEFAULT_PORT,
    type=click.IntRange(0, 65535),
    show_default=True,
    help="Port (0: any free port; the default falls back to a free one when taken).",
)
@click.option("--no-browser", is_flag=True, help="Do not open a browser; print the URL only.")
def view(runs: Sequence[str], host: str, port: int, no_browser: bool) -> None:
    """Browse the rollouts of one or more runs in a local, read-only web page.

    RUN is a run's output file, its folder, or a quoted glob of shards' output files. Two runs
    are also shown side by side (per task, differing tasks first). The page follows a run
    that is still collecting; nothing in the run folder is written or locked.
    """
    try:
        resolved = resolve_runs(runs)
    except ConfigError as exc:
        fail(str(exc))
    if not is_loopback(host):
        click.echo(
            f"trollout view: warning: --host {host} serves these runs' rollouts (prompts, "
            "answers, failures) to every machine that can reach this one; use 127.0.0.1 "
            "unless that is what you want",
            err=True,
        )
    try:
        server = ViewServer(ViewApi(resolved), host, port)
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror}; choose another --port or --host")
    run_trio(_serve, server, no_browser)


async def _serve(server: ViewServer, no_browser: bool) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        runs = len(server.api.runs)
        click.echo(
            f"trollout view: {server.url} ({runs} run{'s' if runs > 1 else ''}, read-only; "
            "Ctrl-C stops)"
        )
        if not no_browser:
            await trio.to_thread.run_sync(webbrowser.open, server.url)
