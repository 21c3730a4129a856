"""Helpers shared by the commands: options, config assembly, exit codes, summaries.

Exit codes (docs/style.md): 0 done; 1 a failed or stopped run; 2 a usage error (bad option, bad
input row, unknown agent: one line on stderr, nothing dispatched, nothing written); 130 SIGINT;
143 SIGTERM. A user mistake never prints a traceback.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn, TypeVar

import click
import httpx
import trio
from rich.console import Console
from rich.text import Text

from ..collector.http.transport import Http11Transport
from ..errors import (
    ConfigError,
    DeploymentError,
    IncompleteEvaluationError,
    RunFolderError,
    RunStoppedError,
    TrolloutError,
)
from ..health import HealthSettings
from ..settings import RunConfig, load_run_config
from ..text import visible
from .health_options import HEALTH_OPTIONS
from .progress import summary_table

__all__ = [
    "build_run_config",
    "collect_options",
    "fail",
    "http_client",
    "live_mode",
    "print_summary",
    "run_options",
    "run_trio",
    "split_args",
]

F = TypeVar("F", bound=Callable[..., Any])

EXIT_USAGE = 2
EXIT_FAILED = 1
EXIT_INCOMPLETE_RETRYABLE = 75  # require_complete, and a resume would dispatch more
EXIT_INCOMPLETE_FINAL = 76  # require_complete, and nothing left can be retried


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``code``.

    Messages quote files and servers, so control characters are shown escaped (`visible`).
    """
    click.echo(f"trollout: error: {visible(message)}", err=True)
    sys.exit(code)


def run_trio(fn: Callable[..., Any], *args: Any) -> Any:
    """Run an async function under Trio, turning trollout's errors into exit codes.

    Nurseries may wrap an error in exception groups; when every leaf is one of ours, each is
    reported on its own line and the exit code is the most severe one's.

    Signals: a dispatch session watches SIGINT and SIGTERM itself (`session`). Outside it
    (discovery, planning, writing the materialized inputs, aggregation) SIGINT interrupts at
    once, as Trio delivers KeyboardInterrupt, and so does SIGTERM (`_SigtermInterrupts`), which
    works whatever SIGINT's disposition (a job started with ``&`` by a script ignores SIGINT);
    both leave the folder as it was or resumable, and exit 130 or 143.
    """
    sigterm = _SigtermInterrupts()
    try:
        return trio.run(sigterm.run, fn, *args)
    except KeyboardInterrupt:
        _interrupted(sigterm.received)
    except TrolloutError as exc:
        report_errors([exc])
    except BaseExceptionGroup as group:
        if group.subgroup(KeyboardInterrupt) is not None:  # raised in a nursery's child task
            _interrupted(sigterm.received)
        leaves = list(_leaves(group))
        if not all(isinstance(leaf, TrolloutError) for leaf in leaves):
            raise
        report_errors(leaves)


def _interrupted(signum: int | None) -> NoReturn:
    name = signal.Signals(signum or signal.SIGINT).name
    click.echo(f"trollout: {name}: stopped; the run folder is kept as it was", err=True)
    sys.exit(128 + (signum or signal.SIGINT))


class _SigtermInterrupts:
    """Make SIGTERM interrupt a Trio run as SIGINT does, without relying on SIGINT at all.

    The handler does what Trio's own SIGINT handler does: in code outside Trio's machinery
    (planning's loops, say) it raises KeyboardInterrupt at once; where Trio is protected from
    KeyboardInterrupt (its scheduler, a task waiting for a worker thread), it cancels the run,
    and the run then ends in KeyboardInterrupt. Either way the code in the run unwinds as on a
    Ctrl-C, so what is written stays whole. Only on the main thread (Python's rule for
    handlers); a session's own signal watcher takes precedence while it is open, and the
    previous handler is restored when the run ends.

    Design note: turning SIGTERM into ``raise_signal(SIGINT)`` was rejected: a process that
    ignores SIGINT (``cmd &`` in a script without job control, a common batch-job pattern)
    gets no SIGINT handler from Trio, so the re-raised signal was dropped and SIGTERM lost.
    """

    def __init__(self) -> None:
        """Start with no signal received."""
        self.received: int | None = None

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` with SIGTERM interrupting it.

        Cancellation: as ``fn``'s; a SIGTERM ends it in KeyboardInterrupt.
        """
        if threading.current_thread() is not threading.main_thread():
            return await fn(*args)
        token = trio.lowlevel.current_trio_token()
        result = None
        with trio.CancelScope() as scope:

            def interrupt(signum: int, frame: object) -> None:
                self.received = signum
                if not trio.lowlevel.currently_ki_protected():
                    raise KeyboardInterrupt
                token.run_sync_soon(scope.cancel, "received SIGTERM")  # signal-safe

            previous = signal.signal(signal.SIGTERM, interrupt)
            try:
                result = await fn(*args)
            finally:
                signal.signal(signal.SIGTERM, previous)
        if self.received is not None:
            raise KeyboardInterrupt
        return result


def report_errors(errors: Sequence[BaseException]) -> NoReturn:
    """Print each error on its own line and exit with the most severe code among them."""
    codes = {_exit_code(error) for error in errors}
    for error in errors:
        prefix = "run stopped: " if isinstance(error, RunStoppedError) else ""
        click.echo(f"trollout: error: {prefix}{visible(str(error))}", err=True)
    sys.exit(next(code for code in _SEVERITY if code in codes))


# When several errors end a run, the exit code is the first of these that applies.
_SEVERITY = (EXIT_FAILED, EXIT_INCOMPLETE_FINAL, EXIT_INCOMPLETE_RETRYABLE, EXIT_USAGE)


def _exit_code(error: BaseException) -> int:
    if isinstance(error, RunStoppedError):  # a RunFolderWriteError is both: the run stopped
        return EXIT_FAILED
    if isinstance(error, ConfigError | DeploymentError | RunFolderError):
        return EXIT_USAGE
    if isinstance(error, IncompleteEvaluationError):
        return EXIT_INCOMPLETE_RETRYABLE if error.retryable else EXIT_INCOMPLETE_FINAL
    return EXIT_FAILED


def _leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[BaseException]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc


def http_client(*, connect_timeout_s: float, read_timeout_s: float) -> httpx.AsyncClient:
    """Return an httpx client for the cold path: head server, ``/aggregate_metrics``, ``/metrics``.

    It runs on trollout's own transport with explicit timeouts: httpx's default of 5 s would cut
    a server's ``/aggregate_metrics`` over a large run short. Use it with ``async with``.
    """
    transport = Http11Transport(connect_timeout_s=connect_timeout_s, read_timeout_s=read_timeout_s)
    return httpx.AsyncClient(transport=transport)


def split_args(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split extra arguments into positionals and ``+key=value`` overrides."""
    overrides = [a for a in args if a.startswith("+")]
    positionals = [a for a in args if not a.startswith("+")]
    return positionals, overrides


# Every option of a run, once; commands pick theirs by name (`run_options`).
_RUN_OPTIONS: dict[str, Callable[[Any], Any]] = {
    "output": click.option(
        "-o",
        "--output",
        "output_jsonl_fpath",
        type=click.Path(dir_okay=False),
        help="Rollouts file to write; its siblings hold failures, inputs, status.",
    ),
    "config": click.option(
        "--config",
        "config_file",
        type=click.Path(exists=True, dir_okay=False),
        help="YAML file of settings (NeMo Gym key names).",
    ),
    "overwrite": click.option(
        "--overwrite",
        is_flag=True,
        default=None,
        help="Start afresh even if the output folder holds a run: its files are deleted, but "
        "only once the new run's inputs are written (without it such a run is refused).",
    ),
    "head-server": click.option(
        "--head-server", help="Head server URL (default http://127.0.0.1:11000)."
    ),
    "agent-url": click.option(
        "--agent-url",
        "agent_urls",
        multiple=True,
        metavar="NAME=URL",
        help="Send agent NAME's rollouts to URL (http://host:port); no head server needed. "
        "Repeatable.",
    ),
    "allow-env": click.option(
        "--allow-env",
        "served_config_env_allow",
        multiple=True,
        metavar="NAME",
        help="Let the head server's config read environment variable NAME through "
        "${oc.env:NAME} (repeatable; none by default: it may name any secret of this "
        "environment). Its value is used to connect, never shown.",
    ),
    "max-line-bytes": click.option(
        "--max-line-bytes",
        "max_input_line_bytes",
        type=int,
        help="Refuse input lines longer than this many bytes (default 64 MiB).",
    ),
    "agent": click.option("--agent", "agent_name", help="Route every row to this agent."),
    "limit": click.option("--limit", type=int, help="Keep the rows of the first N tasks."),
    "num-repeats": click.option(
        "--num-repeats", type=int, help="Rollouts per task row (default 1)."
    ),
    "concurrency": click.option(
        "--concurrency",
        "num_samples_in_parallel",
        type=int,
        help="Requests in flight at most (num_samples_in_parallel, default 64).",
    ),
    "max-rollouts": click.option(
        "--max-rollouts",
        "max_rollouts",
        type=int,
        help="Refuse plans of more rollouts than this (default 10,000,000): a typo in "
        "--num-repeats must not fill the disk.",
    ),
    "max-resident": click.option(
        "--max-resident",
        "max_resident_rollout_tasks",
        type=int,
        help="Rollout tasks alive at once (default: the concurrency).",
    ),
    "add-seed": click.option(
        "--add-seed/--no-add-seed",
        "num_repeats_add_seed",
        default=None,
        help="Put a seed in responses_create_params.metadata.extra_body.",
    ),
    "seed": click.option("--seed", type=int, help="Run seed for seeding rollouts (default 0)."),
    "seed-mode": click.option(
        "--seed-mode",
        type=click.Choice(["hash", "rollout-index"]),
        help="NeMo Gym's rollout index (default) or hash(run seed, task, rollout).",
    ),
    "interleave-repeats": click.option(
        "--interleave-repeats/--no-interleave-repeats",
        default=None,
        help="Dispatch abcabc instead of aabbcc.",
    ),
    "connect-timeout": click.option(
        "--connect-timeout",
        "connect_timeout_s",
        type=float,
        help="Seconds to establish a connection (default 10).",
    ),
    "read-timeout": click.option(
        "--read-timeout",
        "read_timeout_s",
        type=float,
        help="Seconds of silence allowed while waiting for a reply (default 3600).",
    ),
    "reply-timeout": click.option(
        "--reply-timeout",
        "reply_timeout_s",
        type=float,
        help="Seconds one request may take from sending to the last reply byte, however "
        "steadily bytes arrive (default: twice --read-timeout, 7200).",
    ),
    "max-reply-bytes": click.option(
        "--max-reply-bytes",
        "max_reply_bytes",
        type=int,
        help="Longest reply body read, after decoding; a longer one fails the rollout "
        "(default 268435456, 256 MiB).",
    ),
    "fsync": click.option(
        "--fsync",
        type=click.Choice(["row", "batch", "never"]),
        help="When appended rows are fsynced (default batch).",
    ),
    "fail-fast": click.option(
        "--fail-fast/--no-fail-fast",
        default=None,
        help="Stop the run at the first failed rollout (NeMo Gym's old default).",
    ),
    "rollout-timeout": click.option(
        "--rollout-timeout",
        "rollout_timeout_s",
        type=float,
        help="Seconds one rollout may take, retries included (default: no limit).",
    ),
    "retry-requests": click.option(
        "--retry-requests/--no-retry-requests",
        default=None,
        help="Re-send requests that may have been delivered, as new attempts.",
    ),
    "budget": click.option(
        "--budget",
        "dispatch_budget_s",
        type=float,
        help="Start new rollouts only during this many seconds (dispatch_budget_s; > 0).",
    ),
    "drain-margin": click.option(
        "--drain-margin",
        "drain_margin_s",
        type=float,
        help="Stop starting this long before the budget ends (default: p75 of rollouts).",
    ),
    "max-run-time": click.option(
        "--max-run-time",
        "max_run_time_s",
        type=float,
        help="Wall-clock seconds for the run: then stop starting, wait --grace, cancel.",
    ),
    "grace": click.option(
        "--grace",
        "grace_s",
        type=float,
        help="Seconds rollouts in flight get after a stop (signal, --max-run-time; default 30).",
    ),
    "require-complete": click.option(
        "--require-complete/--no-require-complete",
        default=None,
        help="Fail (exit 75/76) instead of scoring a run whose rollouts did not all land.",
    ),
    "no-aggregate": click.option(
        "--no-aggregate",
        "disable_aggregation",
        is_flag=True,
        default=None,
        help="Skip the metrics at the end of the run.",
    ),
    "otlp-endpoint": click.option(
        "--otlp-endpoint",
        "otlp_endpoint",
        help="Send traces and metrics over OTLP/HTTP to this URL (default: "
        "OTEL_EXPORTER_OTLP_ENDPOINT; unset: no telemetry).",
    ),
    "metrics-port": click.option(
        "--metrics-port",
        "metrics_port",
        type=int,
        help="Serve Prometheus metrics on this port while the run lasts (0: any free port; "
        "not with --ray, whose blocks share hosts: use --otlp-endpoint there).",
    ),
    "metrics-host": click.option(
        "--metrics-host",
        "metrics_host",
        help="Address the Prometheus endpoint binds (default 127.0.0.1, loopback only).",
    ),
    "progress": click.option(
        "--progress",
        "live",
        type=click.Choice(["auto", "live", "plain"]),
        default="auto",
        show_default=True,
        help="Live display on a terminal, periodic lines otherwise.",
    ),
}


def run_options(*names: str) -> Callable[[F], F]:
    """Return a decorator attaching the named run options, in the order given."""
    unknown = [name for name in names if name not in _RUN_OPTIONS]
    if unknown:  # pragma: no cover - a programming error caught by any CLI test
        raise KeyError(f"no run options {unknown!r}")

    def attach(f: F) -> F:
        for name in reversed(names):
            f = _RUN_OPTIONS[name](f)
        return f

    return attach


_RUN_OPTIONS.update(HEALTH_OPTIONS)  # --no-health-check, --health-check-ignore, -workers
collect_options = run_options(*_RUN_OPTIONS)
"""The options of a collection run (collect and demo take them all)."""


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


def print_summary(result: Any, *, title: str) -> None:
    """Print the final summary table of a run on stdout."""
    console = Console()
    console.print(
        summary_table(
            result.progress, total=result.expected, elapsed_s=result.elapsed_s, title=title
        )
    )
    console.print(Text(visible(f"rollouts: {result.layout.rollouts}")))
    console.print(Text(visible(f"failures: {result.layout.failures}")))


def live_mode(value: str) -> bool | None:
    """Map ``--progress`` to the reporter's ``live`` flag (None: decide by terminal)."""
    return {"auto": None, "live": True, "plain": False}[value]
