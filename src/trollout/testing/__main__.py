"""Command line of the fake deployment.

python -m trollout.testing serve --spec fixtures/demo_deployment.yaml [--port-base N]
    [--fault-script FILE]
python -m trollout.testing write-tasks OUT.jsonl --rows 100000 [--seed S]
"""

from __future__ import annotations

from functools import partial

import click
import trio

from ..errors import ConfigError
from .fault_scripts import FaultScript
from .process import raise_fd_limit, serve_until_signal
from .spec import load_spec
from .tasks import write_tasks


@click.group()
def main() -> None:
    """Run trollout's fake NeMo Gym deployment."""


@main.command()
@click.option("--spec", "spec_path", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--port-base", type=int, default=None, help="Ports from N (head first); default any.")
@click.option(
    "--sleep", "sleep_s", type=float, default=None, help="Every /run sleeps S s, no faults."
)
@click.option("--no-record-runs", is_flag=True, help="Keep counters only (benchmarks).")
@click.option(
    "--fault-script",
    type=click.Path(dir_okay=False),
    default=None,
    help="A JSON Lines fault script (FaultScript), re-read when it changes.",
)
def serve(
    spec_path: str,
    port_base: int | None,
    sleep_s: float | None,
    no_record_runs: bool,
    fault_script: str | None,
) -> None:
    """Serve a deployment until SIGTERM/SIGINT; print its URLs as one JSON line when ready."""
    try:
        spec = load_spec(spec_path)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    if sleep_s is not None:
        spec = spec.with_sleep(sleep_s)
    raise_fd_limit()
    record_runs = False if no_record_runs else None
    hook = FaultScript(fault_script) if fault_script is not None else None
    trio.run(
        partial(
            serve_until_signal, spec, port_base=port_base, record_runs=record_runs, fault_fn=hook
        )
    )


@main.command("write-tasks")
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--rows", type=int, required=True, help="How many rows to write.")
@click.option("--seed", type=int, default=0, help="Seed of the generator.")
@click.option("--duplicate-fraction", type=float, default=0.0, help="Share of repeated rows.")
def write_tasks_command(out: str, rows: int, seed: int, duplicate_fraction: float) -> None:
    """Write a synthetic JSONL dataset of arithmetic and string tasks."""
    write_tasks(out, rows, seed, duplicate_fraction=duplicate_fraction)


if __name__ == "__main__":
    main()
