"""`trollout demo`: a whole run against the bundled fake deployment, on loopback.

It starts `trollout.testing`'s fake NeMo Gym deployment (a head server, agents behind
environment servers, an episode environment server, a few scripted faults) inside this process,
collects the example dataset through the head server exactly as `trollout collect` would, and
prints the summary. The dataset mixes flat rows, routed by agent, with one taskset of
materialized task rows, routed to the episode server by the spec's tasksets (what
``+environment_server_routes`` says in a real run). It is what ``make run`` runs, and the
quickest way to see every file a run writes.

It runs from any directory: the example dataset and the deployment spec are package data
(``trollout/testing/demo/``, listed in pyproject.toml), found beside this module, not under the
current directory; ``fixtures/`` in the repository links to them, so the README's paths still
name them. Only the output (``runs/demo/``) is relative to the current directory, like every
``-o``. Rejected: looking for ``fixtures/`` upwards from the current directory (works only
inside a checkout, never from an installed wheel).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import click

from ..errors import ConfigError
from ..run.compose import RunResult
from ..settings import RunConfig
from .collect import report_run
from .common import collect_options, live_mode
from .failures import fail, run_trio
from .run_config import build_run_config
from .session import collect_run

if TYPE_CHECKING:  # the fake deployment is imported by the demo only, not by every command
    from ..testing import DeploymentSpec

__all__ = ["demo"]

BUNDLED = Path(__file__).resolve().parents[1] / "testing" / "demo"  # package data
DEFAULT_INPUT = str(BUNDLED / "example_tasks.jsonl")
DEFAULT_SPEC = str(BUNDLED / "demo_deployment.yaml")
DEFAULT_OUTPUT = "runs/demo/rollouts.jsonl"


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED, metavar="[INPUT] [+key=value ...]")
@click.option(
    "--spec",
    "spec_path",
    default=DEFAULT_SPEC,
    show_default="the bundled demo_deployment.yaml",
    type=click.Path(dir_okay=False),
    help="Fake deployment to start (YAML spec).",
)
@collect_options
def demo(args: tuple[str, ...], spec_path: str, live: str, **options: Any) -> None:
    """Start the bundled fake deployment, collect INPUT from it, print the summary.

    INPUT defaults to the bundled example_tasks.jsonl (from any directory), the output to
    runs/demo/rollouts.jsonl (replaced by each demo; a folder given with -o is replaced only
    with --overwrite), the run to 4 seeded repeats per task, and environment_server_routes to
    the spec's tasksets.
    """
    options = {k: v for k, v in options.items() if v is not None and v != ()}
    if "output_jsonl_fpath" not in options:  # the demo's own folder: each demo replaces it
        options.update(output_jsonl_fpath=DEFAULT_OUTPUT, overwrite=True)
    options.setdefault("num_repeats", 4)
    options.setdefault("num_repeats_add_seed", True)
    if not any(not a.startswith("+") for a in args):
        args = (DEFAULT_INPUT, *args)
    try:
        config = build_run_config(args, options)
        spec = _load_spec(spec_path)
        if not config.environment_server_routes:
            config = attrs.evolve(config, environment_server_routes=spec.routes)
        if not config.observability_enabled:  # the fake model server captures its calls
            captures = str(Path(config.output_jsonl_fpath or DEFAULT_OUTPUT).absolute().parent)
            config = attrs.evolve(
                config, observability_enabled=True, model_call_capture_dir=captures + "/model-calls"
            )
        spec = attrs.evolve(spec, model_call_capture_dir=config.model_call_capture_dir)
    except ConfigError as exc:
        fail(str(exc))
    result: RunResult = run_trio(_demo, spec, config, live_mode(live))
    report_run(result, title="trollout demo")


def _load_spec(path: str) -> DeploymentSpec:
    if not Path(path).is_file():
        raise ConfigError(
            f"fake deployment spec {path!r} not found; pass an existing spec with --spec"
        )
    from ..testing import load_spec

    return load_spec(path)


async def _demo(spec: DeploymentSpec, config: RunConfig, live: bool | None) -> RunResult:
    from ..testing import open_fake_deployment

    async with open_fake_deployment(spec) as fake:
        config = attrs.evolve(config, head_server=fake.head_url)
        return await collect_run(config, live=live)
