"""The ``trollout`` command line: a click group composing the public API.

Each command lives in its own module and uses the same public API an embedding driver uses;
this module only assembles the group. Exit codes are listed in `common`.
"""

from __future__ import annotations

from collections.abc import Sequence

import click

from .. import __version__
from .aggregate import aggregate
from .collect import collect
from .demo import demo
from .health import health_check
from .resume import resubmit, resume
from .sbatch import sbatch
from .status import status
from .view import view

__all__ = ["cli", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="trollout")
def cli() -> None:
    """Collect rollouts from a NeMo Gym deployment, durably, with Trio.

    Run `trollout demo` to see a whole run against a bundled fake deployment.
    """


cli.add_command(collect)
cli.add_command(demo)
cli.add_command(resume)
cli.add_command(resubmit)
cli.add_command(status)
cli.add_command(aggregate)
cli.add_command(sbatch)
cli.add_command(health_check)
cli.add_command(view)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``trollout`` console script."""
    cli.main(args=list(argv) if argv is not None else None, prog_name="trollout")


if __name__ == "__main__":  # python -m trollout.cli.main (crash tests run it this way)
    main()
