"""``trollout aggregate``: merge shards, compute honest metrics, write the report.

Accepts NeMo Gym's spelling too: ``+input_glob=... +output_jsonl_fpath=...
+count_failure_classes_as_zero=[a,b] +count_missing_rollouts_as_zero=true``. Server metrics are
asked for only with ``--head-server`` / ``--agent-url`` / ``--environment-server-url``; without
them (or with no server running) metrics are computed locally.

Exit codes: 0 done; 1 a server's ``/aggregate_metrics`` failed (everything else was written);
2 a usage error (bad option, bad input line, output that is an input, unreachable head server).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
import httpx
import orjson
import trio
from rich.console import Console

from ..collector.deployment import discover
from ..config import head_server_url, parse_override
from ..errors import ConfigError, DeploymentError
from ..metrics import AggregateOptions, AggregateResult, aggregate_shards, print_report
from ..metrics import resolve_inputs as resolve_globs
from ..metrics.server import Target
from ..text import visible
from .common import fail, http_client

__all__ = ["aggregate"]

_OVERRIDES = frozenset(
    {
        "input_glob",
        "output_jsonl_fpath",
        "count_failure_classes_as_zero",
        "count_missing_rollouts_as_zero",
        "head_server",
        "seed",
    }
)
_PATH_KEYS = frozenset({"input_glob", "output_jsonl_fpath"})
_HELP = """Merge rollouts shards and compute metrics that say what they cover.

INPUT is a rollouts file, a glob, or comma-separated globs (quote them); sidecars and
materialized inputs are found beside each shard and never taken as shards. Shards are read in
sorted order. A (task, rollout) of one agent lands once: the first landed row in shard order
wins, later copies are reported as duplicates; a landed row beats any failure of the same
rollout; a file identical to one already read is skipped.

Writes OUTPUT (the merged rollouts, with merged sidecars), <stem>_aggregate_metrics.json and
<stem>_report.html beside it; without -o, one shard's metrics are written beside it.
"""


@click.command("aggregate", help=_HELP, context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED, metavar="[INPUT]... [+key=value]...")
@click.option("-i", "--input", "inputs", multiple=True, help="A shard glob (repeatable).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Merged rollouts file.")
@click.option(
    "--count-failure-classes-as-zero",
    "zero_classes",
    multiple=True,
    metavar="CLASS[,CLASS]",
    help="Failure classes whose latest row counts as reward 0 in the metrics.",
)
@click.option(
    "--count-missing-rollouts-as-zero",
    "zero_missing",
    is_flag=True,
    default=None,
    help="Planned rollouts with no row count as reward 0 in the metrics.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
@click.option("--no-report", is_flag=True, help="Do not write <stem>_report.html.")
@click.option("--seed", type=int, default=None, help="Bootstrap seed (default 0).")
@click.option(
    "--bootstrap-samples",
    type=click.IntRange(min=0),
    default=1000,
    show_default=True,
    help="Resamples per confidence interval (0: normal approximation).",
)
@click.option("--head-server", help="Ask this deployment's servers for /aggregate_metrics.")
@click.option(
    "--agent-url",
    "agent_urls",
    multiple=True,
    metavar="NAME=URL",
    help="Ask agent NAME at URL for /aggregate_metrics (repeatable).",
)
@click.option(
    "--environment-server-url",
    "env_urls",
    multiple=True,
    metavar="NAME=URL",
    help="Ask environment server NAME at URL for /aggregate_metrics (repeatable).",
)
def aggregate(args: tuple[str, ...], **opts: Any) -> None:
    try:
        settings = _settings(args, opts)
        shards = resolve_globs(settings["inputs"])
        result = trio.run(_run, shards, settings)
    except (ConfigError, DeploymentError) as exc:
        fail(str(exc))
    if settings["as_json"]:
        click.echo(orjson.dumps(result.to_json(), option=orjson.OPT_INDENT_2).decode())
    else:
        print_report(result, Console(soft_wrap=False))
        _print_files(result)
    if not result.ok:
        fail(
            f"{len(result.server_errors)} /aggregate_metrics call(s) failed; "
            "local metrics and the report were written",
            1,
        )


def _settings(args: Sequence[str], opts: dict[str, Any]) -> dict[str, Any]:
    """Merge positionals, options and ``+key=value`` tokens (tokens win)."""
    inputs = [a for a in args if not a.startswith("+")] + list(opts["inputs"])
    classes = [c.strip() for text in opts["zero_classes"] for c in text.split(",") if c.strip()]
    values: dict[str, Any] = {
        "count_failure_classes_as_zero": classes or None,
        "count_missing_rollouts_as_zero": opts["zero_missing"],
        "output_jsonl_fpath": opts["output"],
        "head_server": opts["head_server"],
        "seed": opts["seed"],
    }
    for token in (a for a in args if a.startswith("+")):
        key, value = _override(token)
        if key not in _OVERRIDES:
            raise ConfigError(f"unknown aggregate setting {key!r}; known: {sorted(_OVERRIDES)}")
        if key == "input_glob":
            inputs.extend(value if isinstance(value, list) else [str(value)])
        else:
            values[key] = value
    if not inputs:
        raise ConfigError("no INPUT given; pass a glob such as 'shards/*.jsonl' or +input_glob=...")
    return {**opts, **values, "inputs": inputs, "targets": _targets(opts)}


def _override(token: str) -> tuple[str, Any]:
    """Parse ``+key=value``; a path or glob is taken as written (it may hold commas)."""
    key, _, raw = token.lstrip("+").partition("=")
    if key.strip() in _PATH_KEYS and raw and raw[0] not in "[{'\"":
        return key.strip(), raw
    return parse_override(token)


def _targets(opts: dict[str, Any]) -> list[Target]:
    out: list[Target] = []
    for kind, pairs in (("agent", opts["agent_urls"]), ("env", opts["env_urls"])):
        for pair in pairs:
            name, sep, url = pair.partition("=")
            if not sep or not name or not url.startswith(("http://", "https://")):
                raise ConfigError(f"expected NAME=http://host:port, got {pair!r}")
            out.append((name, None, url) if kind == "agent" else (None, name, url))
    return out


def _options(settings: dict[str, Any]) -> AggregateOptions:
    classes = settings["count_failure_classes_as_zero"]
    if isinstance(classes, str):
        classes = [classes]
    return AggregateOptions(
        count_failure_classes_as_zero=frozenset(classes) if classes is not None else None,
        count_missing_rollouts_as_zero=bool(settings["count_missing_rollouts_as_zero"]),
        bootstrap_samples=settings["bootstrap_samples"],
        seed=int(settings["seed"] or 0),
        write_report=not settings["no_report"],
    )


async def _run(shards: list[Path], settings: dict[str, Any]) -> AggregateResult:
    output = settings["output_jsonl_fpath"]
    targets: list[Target] = list(settings["targets"])
    async with http_client(connect_timeout_s=10.0, read_timeout_s=600.0) as client:
        if settings["head_server"]:
            targets += await _discover(client, settings["head_server"])
        return await aggregate_shards(
            shards,
            output=Path(output) if output else None,
            options=_options(settings),
            targets=targets,
            client=client,
        )


async def _discover(client: httpx.AsyncClient, head: Any) -> list[Target]:
    if isinstance(head, dict):
        head = head_server_url(head)
    try:
        deployment = await discover(client, str(head))
    except DeploymentError as exc:
        raise DeploymentError(f"{exc} (or drop --head-server to aggregate locally)") from exc
    return list(deployment.aggregate_metrics_targets())


def _print_files(result: AggregateResult) -> None:
    written = [result.merged_path, result.metrics_path, result.report_path]
    click.echo("wrote " + ", ".join(visible(str(p)) for p in written if p is not None), err=True)
