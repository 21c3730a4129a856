"""A Slurm array job for one collection run: the script ``trollout sbatch`` writes.

Job I of the array runs ``trollout collect ... --shard I/N --resume`` into shard folder I
(`layout.shard_output`), so submitting the same script again (all of it, or ``--array=3,5``)
resumes every shard where it stopped and finishes at once the ones already done. The shard count
N is written into the script rather than read from ``SLURM_ARRAY_TASK_COUNT``, because a
resubmission of some indices has a smaller count; the index is ``SLURM_ARRAY_TASK_ID``, checked
by ``--shard`` itself (an index past N exits 2).

Stopping and requeueing. The script asks Slurm for SIGTERM two minutes before the time limit
(``--signal=B:TERM@120``, to the batch shell only) and runs trollout as its child: the shell
passes SIGTERM (or SIGINT) on, trollout does what it does on any SIGTERM (starts nothing new,
gives rollouts in flight ``--grace`` seconds, writes everything down, exits 143 with a
resumable shard), and the shell then asks Slurm to requeue the task (``scontrol requeue``, the
script has ``--requeue``), so Slurm runs it again and it resumes where it stopped: the task
ends ``REQUEUED``, never ``FAILED``, and the array (and an ``afterok`` job on it) completes.
The same path serves ``scancel -b --signal=TERM JOB_TASK`` (stop this shard now and run it
again later) and a preemption that signals the job. Plain ``scancel`` cancels for good: the
requeue is refused for a cancelled job and the task stays ``CANCELLED``. A task whose
trollout failed for another reason (an endpoint down, bad input) exits with trollout's code
and is recorded ``FAILED``: requeueing would only fail again. A harder kill is safe too
(attempts are reserved before they are sent), only less tidy.

A resubmitted or requeued task dispatches only the rollouts of its shard that never finished
(``--no-retry-failed``: interrupted or never started), so a finished shard ends at once and a
preemption cannot change the merged result against an uninterrupted run (which does not
re-send a retryable failure either); retrying failures stays the explicit ``trollout resume``.
Logs go to ``<shards>/logs/slurm-%A_%a.out``, appended (``--open-mode=append``), so a requeued
task adds to its first log instead of replacing it.

The merge: `aggregate_job_options` and `aggregate_command` make the job ``trollout sbatch
--submit`` submits after the array (``--dependency=afterok:ARRAY``), which writes OUT when
every task has completed; the script's header shows the same commands for a manual submit.

Design note: a generated script was chosen over submitit (considered again with requeueing):
the script is what Slurm runs, so the tests submit exactly that to a real Slurm (and run it with
``bash`` and the ``SLURM_*`` variables set); it needs nothing installed beyond trollout, and a
cluster's admins can read it. submitit's requeue-on-timeout is what the script's last lines do;
it would add a dependency, pickle the job through its own files, and its local executor would
test submitit's process handling rather than the command Slurm starts. A shard folder is its own
checkpoint, so submitit's checkpointing has nothing to add.

Nothing given can become a line or a command of the script. Every value written into it (the
``#SBATCH`` options, collect's arguments, the paths, the interpreter) is refused when it holds a
control character (`text.has_control`: a newline would end the line it is on, so
``--partition $'gpu\n#SBATCH --uid=0'`` or a newline in a path would add a line that bash or
Slurm obeys), and every value is one shell word quoted with ``shlex.quote``: the collect line's
words for bash, each ``#SBATCH`` option for Slurm, whose directive parser splits words and strips
quotes as a shell does (``--partition='gpu --uid=0'`` is one option with a space, never two).
Rejected alternative: escaping control characters (``$'...'``) instead of refusing them. No
Slurm option, partition or path needs one, and Slurm's directive parser does not read
``$'...'``.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from attrs import frozen

from .._version import __version__
from ..errors import ConfigError
from ..text import has_control, visible
from .layout import shards_root

__all__ = [
    "SIGNAL_LEAD_S",
    "Submitted",
    "aggregate_command",
    "aggregate_job_options",
    "logs_folder",
    "parse_slurm_time",
    "sbatch_script",
    "short_time_warning",
    "submit",
]

SIGNAL_LEAD_S = 120  # SIGTERM this long before the time limit: --grace plus writing down
_STOPPED = (130, 143)  # trollout's exits after SIGINT / SIGTERM: a resumable shard


def logs_folder(output: Path) -> Path:
    """Return the folder of the array's logs (inside the shards folder of `output`)."""
    return shards_root(output) / "logs"


def sbatch_script(
    *,
    output: Path,
    shards: int,
    collect_args: Sequence[str],
    python: str,
    workdir: Path,
    sbatch_options: Sequence[str] = (),
) -> str:
    """Return the text of the array script (module docstring).

    Args:
        output: the merged run's rollouts file (absolute); shards go under its shards folder.
        shards: N, the number of array jobs and shards.
        collect_args: ``collect``'s INPUT, options and ``+key=value`` settings, minus ``-o``.
        python: the interpreter that has trollout installed (absolute).
        workdir: the folder relative paths in ``collect_args`` are relative to.
        sbatch_options: extra ``#SBATCH`` options, one argument each (``--time=4:00:00``,
            ``--partition=gpu``); each is written as one quoted word, after trollout's own
            (so an ``--output`` given here replaces the default log path).

    Raises:
        ConfigError: a value holds a control character (one line naming the value).
    """
    _refuse_controls(
        [
            *(("the #SBATCH option", option) for option in sbatch_options),
            *(("the collect argument", arg) for arg in collect_args),
            ("the output path", str(output)),
            ("the working directory", str(workdir)),
            ("the interpreter path", python),
        ]
    )
    root = shards_root(output)
    name = output.name
    command = [python, "-m", "trollout.cli.main", "collect", *collect_args]
    merge = aggregate_command(output=output, shards=shards, python=python)
    logs = logs_folder(output) / "slurm-%A_%a.out"
    q = shlex.quote
    header = [
        "#!/bin/bash",
        f"# trollout {__version__}: one collection run as {shards} Slurm array jobs, a shard each.",
        "#",
        f"#   sbatch {{this script}}                 every shard (array 0-{shards - 1})",
        "#   sbatch --array=3,5 {this script}     only shards 3 and 5; each resumes its folder",
        f"#   trollout status {q(str(root))}",
        "#   merge when every task completed (trollout sbatch --submit submits this for you):",
        f"#   sbatch --dependency=afterok:ARRAY_JOB_ID --wrap {q(shlex.join(merge))}",
        "#",
        f"# Slurm sends SIGTERM {SIGNAL_LEAD_S} s before the time limit (and scancel -b",
        "# --signal=TERM sends it now): the job stops starting rollouts, lets those in flight",
        "# finish (--grace), writes everything down and requeues itself; run again, it resumes",
        "# the shard where it stopped. Plain scancel stops a task for good (resumable by hand).",
        f"#SBATCH --array=0-{shards - 1}",
        f"#SBATCH {q(f'--chdir={workdir}')}",
        f"#SBATCH --signal=B:TERM@{SIGNAL_LEAD_S}",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        f"#SBATCH {q(f'--output={logs}')}",
        *(f"#SBATCH {q(option)}" for option in sbatch_options),
    ]
    stopped = " || ".join(f'[ "$CODE" -eq {code} ]' for code in _STOPPED)
    body = [
        "set -uo pipefail",
        f"SHARDS={shards}",
        'ID="${SLURM_ARRAY_TASK_ID:?is not set: submit this script with sbatch}"',
        f'OUT="$(printf \'%s/%05d-of-%05d/%s\' {q(str(root))} "$ID" "$SHARDS" {q(name)})"',
        f"{shlex.join(command)} \\",
        '  -o "$OUT" --shard "$ID/$SHARDS" --resume --no-retry-failed --no-aggregate \\',
        "  --progress plain &",
        "PID=$!",
        "# Slurm signals this shell (B:TERM, scancel -b): pass it on to trollout as SIGTERM",
        "# (a background job of a script ignores SIGINT, so INT is passed on as TERM too).",
        "trap 'kill -TERM \"$PID\" 2>/dev/null' TERM INT",
        'wait "$PID"; CODE=$?',
        'while kill -0 "$PID" 2>/dev/null; do wait "$PID"; CODE=$?; done',
        f"if {stopped}; then",
        '  TASK="${SLURM_ARRAY_JOB_ID:-${SLURM_JOB_ID:-}}_${ID}"',
        '  echo "trollout: shard $ID stopped cleanly; requeueing task $TASK (it resumes)" >&2',
        "  # Slurm ends this shell as it requeues the task: nothing after this line runs then.",
        "  # (the task by ARRAY_TASK: the array's own job id would requeue every task of it)",
        '  if [ -n "${SLURM_JOB_ID:-}" ] && scontrol requeue "$TASK"; then exit 0; fi',
        '  echo "trollout: shard $ID stopped; requeue refused: submit again to resume" >&2',
        "fi",
        'exit "$CODE"',
    ]
    return "\n".join([*header, *body]) + "\n"


def aggregate_command(*, output: Path, shards: int, python: str) -> list[str]:
    """Return the command that merges the array's shards into `output`."""
    glob = f"{shards_root(output)}/*-of-{shards:05d}/{output.name}"
    return [python, "-m", "trollout.cli.main", "aggregate", glob, "-o", str(output)]


def aggregate_job_options(
    *, output: Path, array_job: int, job_name: str, workdir: Path
) -> list[str]:
    """Return ``sbatch``'s options for the merge job that runs after array job `array_job`.

    ``afterok``: it starts when every task completed (a requeued task completes when it runs
    again); if a task fails, Slurm cancels it (``--kill-on-invalid-dep=yes``) rather than keep
    it pending forever, and ``trollout status`` says which shard to look at.
    """
    return [
        f"--dependency=afterok:{array_job}",
        "--kill-on-invalid-dep=yes",
        f"--job-name={job_name}-aggregate",
        f"--chdir={workdir}",
        "--open-mode=append",
        f"--output={logs_folder(output) / 'aggregate-%j.out'}",
    ]


@frozen
class Submitted:
    """What `submit` handed to Slurm: the array's job id and the merge job's (or None)."""

    array_job: int
    aggregate_job: int | None


def submit(
    script: Path, *, output: Path, shards: int, python: str, workdir: Path, job_name: str,
    aggregate: bool = True,
) -> Submitted:  # fmt: skip
    """Submit the array script, then (unless not `aggregate`) the merge job after it.

    Raises:
        ConfigError: ``sbatch`` is not on PATH, or refused a submission (its message, one
            line); when the merge job is refused the array stays submitted and the message
            says so, with the command to submit the merge by hand.
    """
    if shutil.which("sbatch") is None:
        raise ConfigError("sbatch is not on PATH: run this on a Slurm login node, or drop "
                          "--submit and submit the script there")  # fmt: skip
    array = _sbatch(["--parsable", str(script)], "the array")
    if not aggregate:
        return Submitted(array, None)
    options = aggregate_job_options(
        output=output, array_job=array, job_name=job_name, workdir=workdir
    )
    merge = shlex.join(aggregate_command(output=output, shards=shards, python=python))
    try:
        job = _sbatch(["--parsable", *options, "--wrap", merge], "the merge job")
    except ConfigError as exc:
        raise ConfigError(
            f"{exc} (the array is submitted as job {array}; submit the merge yourself: sbatch "
            f"--dependency=afterok:{array} --wrap {shlex.quote(merge)})"
        ) from None
    return Submitted(array, job)


def _sbatch(args: list[str], what: str) -> int:
    done = subprocess.run(["sbatch", *args], capture_output=True, text=True, check=False)
    out = done.stdout.strip()
    if done.returncode != 0 or not out.split(";")[0].isdigit():
        reason = visible(
            (done.stderr or done.stdout).strip().splitlines()[-1:][0]
            if (done.stderr or done.stdout).strip()
            else f"exit {done.returncode}"
        )
        raise ConfigError(f"sbatch refused {what}: {reason}")  # fmt: skip
    return int(out.split(";")[0])


_TIME = re.compile(
    r"^(?:(?P<days>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
    r"|(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?)$"
)


def parse_slurm_time(value: str) -> float | None:
    """Return a Slurm ``--time`` in seconds; None for "infinite"/"unlimited" or unparsable.

    Slurm's forms: ``minutes``, ``minutes:seconds``, ``hours:minutes:seconds``, ``days-hours``,
    ``days-hours:minutes``, ``days-hours:minutes:seconds``.
    """
    text = value.strip().lower()
    match = _TIME.match(text)
    if match is None:
        return None
    g = {k: int(v) for k, v in match.groupdict().items() if v is not None}
    if "days" in g:
        return g["days"] * 86400.0 + g["dh"] * 3600 + g.get("dm", 0) * 60 + g.get("ds", 0)
    if "c" in g:
        return g["a"] * 3600.0 + g["b"] * 60 + g["c"]
    if "b" in g:
        return g["a"] * 60.0 + g["b"]
    return g["a"] * 60.0


def short_time_warning(time_limit: str, grace_s: float) -> str | None:
    """Return a warning when `time_limit` leaves no room before the SIGTERM margin, else None.

    Slurm signals ``SIGNAL_LEAD_S`` seconds before the limit; a job whose limit is that short
    or shorter is signalled as it starts and never dispatches a rollout.
    """
    seconds = parse_slurm_time(time_limit)
    if seconds is None or seconds > SIGNAL_LEAD_S:
        return None
    return (
        f"--time {visible(time_limit)} is within the {SIGNAL_LEAD_S} s signal margin: Slurm "
        "sends SIGTERM as each task starts, so no rollout runs; give at least "
        f"{int(SIGNAL_LEAD_S + max(grace_s, 60)) // 60 + 1} minutes"
    )


def _refuse_controls(values: Sequence[tuple[str, str]]) -> None:
    """Refuse any value holding a control character: it could end its line of the script."""
    for what, value in values:
        if has_control(value):
            raise ConfigError(
                f"{what} '{visible(value)}' holds a control character (a newline would start a "
                "new line of the job script); remove it"
            )
