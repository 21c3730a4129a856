"""The command line's config: positionals, options and ``+key=value`` tokens, one `RunConfig`.

The option table itself is `common._RUN_OPTIONS` (settings knowledge, kept in one place); this
module merges what a command was given into a config through `settings.load_run_config`, with
the options' spellings in messages and the loader's notes on stderr.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

from ..errors import ConfigError
from ..health import HealthSettings
from ..settings import RunConfig, load_run_config
from ..text import visible
from .common import collect_options

__all__ = ["RUN_DEFAULTS", "build_run_config", "split_args"]


def split_args(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split extra arguments into positionals and ``+key=value`` overrides."""
    overrides = [a for a in args if a.startswith("+")]
    positionals = [a for a in args if not a.startswith("+")]
    return positionals, overrides


# The command line is NeMo Gym's full evaluation path (`gym eval run`), which round-robins
# dispatch by agent; an embedding driver's RunConfig keeps the order it supplied.
RUN_DEFAULTS: dict[str, Any] = {"round_robin_agents": True}


def build_run_config(
    args: Sequence[str],
    options: dict[str, Any],
    *,
    input_required: bool = True,
    saved: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
) -> RunConfig:
    """Merge positionals, options and overrides into a `RunConfig` (ConfigError on bad input).

    Every NeMo Gym setting is taken (`settings`); a note is printed for each one trollout
    already handles its own way, and for each setting a higher source replaced under another
    key; one setting given twice on the command line is refused (`settings.load_run_config`).
    ``saved``: a resumed run's settings, below the command line. ``labels``: how settings the
    caller put in ``options`` were given (``RUN``), for messages. Beyond `RunConfig`'s own
    checks, the health check ids are checked here (by `health.HealthSettings`, as
    `trollout.load_config` does: settings does not know them), and a dispatch budget of 0 is
    refused: for the engine (and an embedding driver)
    it means "start nothing", which from the command line can only be a mistake that would end
    in a run with no rollout.
    """
    positionals, overrides = split_args(args)
    if len(positionals) > 1:
        raise ConfigError(
            f"expected one INPUT file, got {len(positionals)}: {positionals!r}; "
            "settings go as +key=value"
        )
    config_file = options.pop("config_file", None)
    options.pop("live", None)
    if positionals:
        options["input_jsonl_fpath"] = positionals[0]
    if options.get("agent_urls"):
        options["agent_urls"] = _parse_agent_urls(options["agent_urls"])
    else:
        options.pop("agent_urls", None)
    if options.get("served_config_env_allow"):
        options["served_config_env_allow"] = list(options["served_config_env_allow"])
    else:
        options.pop("served_config_env_allow", None)
    config, notes = load_run_config(
        config_file=config_file,
        options=options,
        overrides=overrides,
        defaults=RUN_DEFAULTS,
        saved=saved,
        labels={**_option_labels(), "input_jsonl_fpath": "INPUT", **(labels or {})},
    )
    for note in notes:
        click.echo(f"trollout: note: {visible(note)}", err=True)
    HealthSettings.of(config)  # unknown health check ids, refused before anything runs
    if config.dispatch_budget_s == 0:
        raise ConfigError(
            f"dispatch_budget_s (--budget) must be > 0 (got {config.dispatch_budget_s!r}): a "
            "budget of 0 starts no rollout; give seconds > 0, or leave it unset for no budget"
        )
    return config


def _parse_agent_urls(values: Sequence[str]) -> dict[str, str]:
    urls: dict[str, str] = {}
    for value in values:
        name, sep, url = value.partition("=")
        if not sep or not name or not url:
            raise ConfigError(f"--agent-url {value!r} must look like NAME=http://host:port")
        if name in urls:  # the URLs are not shown: one may carry what it should not
            raise ConfigError(f"--agent-url names agent {name!r} twice; give one URL per agent")
        urls[name] = url
    return urls


def _option_labels() -> dict[str, str]:
    """Return how each setting is spelled as an option (``-o/--output``), for messages.

    The run options, and those of the command now running (resume's, sbatch's collect).
    """
    commands = [click.command()(collect_options(lambda **_: None))]
    context = click.get_current_context(silent=True)
    if context is not None:
        commands.append(context.command)
    return {
        param.name: "/".join(param.opts)
        for command in commands
        for param in command.params
        if isinstance(param, click.Option) and param.name
    }
