"""A Slurm array job for one collection run: the script ``trollout sbatch`` writes.

Job I of the array runs ``trollout collect ... --shard I/N --resume`` into shard folder I
(`layout.shard_output`), so submitting the same script again (all of it, or ``--array=3,5``)
resumes every shard where it stopped and finishes at once the ones already done. The shard count
N is written into the script rather than read from ``SLURM_ARRAY_TASK_COUNT``, because a
resubmission of some indices has a smaller count; the index is ``SLURM_ARRAY_TASK_ID``, checked
by ``--shard`` itself (an index past N exits 2).

Time limits: the script asks Slurm for SIGTERM two minutes before the limit
(``--signal=B:TERM@120``; the batch shell is trollout itself, through ``exec``). trollout then
does what it does on any SIGTERM: starts nothing new, gives rollouts in flight ``--grace``
seconds, writes everything down and exits 143 with a resumable shard. A harder kill is safe too
(attempts are reserved before they are sent), only less tidy.

Design note: a generated script was chosen over submitit. The script is what Slurm runs, so CI
tests exactly that (run with ``bash`` and the ``SLURM_*`` variables set, one job ended by
SIGTERM and run again); it needs nothing installed beyond trollout, and a cluster's admins can
read it. submitit would add a dependency, pickle the job through its own files, and its local
executor would test submitit's process handling rather than the command Slurm starts; its
checkpoint-and-requeue needs nothing here, since a shard folder is its own checkpoint.

Nothing given can become a line or a command of the script. Every value written into it (the
``#SBATCH`` options, collect's arguments, the paths, the interpreter) is refused when it holds a
control character (`text.has_control`: a newline would end the line it is on, so
``--partition $'gpu\n#SBATCH --uid=0'`` or a newline in a path would add a line that bash or
Slurm obeys), and every value is one shell word quoted with ``shlex.quote``: the ``exec`` line's
words for bash, each ``#SBATCH`` option for Slurm, whose directive parser splits words and strips
quotes as a shell does (``--partition='gpu --uid=0'`` is one option with a space, never two).
Rejected alternative: escaping control characters (``$'...'``) instead of refusing them. No
Slurm option, partition or path needs one, and Slurm's directive parser does not read
``$'...'``.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from .._version import __version__
from ..errors import ConfigError
from ..text import has_control, visible
from .layout import shards_root

__all__ = ["sbatch_script"]

_SIGNAL_LEAD_S = 120  # SIGTERM this long before the time limit: --grace plus writing down


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
            ``--partition=gpu``); each is written as one quoted word.

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
    glob = f"{root}/*-of-{shards:05d}/{name}"
    command = [python, "-m", "trollout.cli.main", "collect", *collect_args]
    header = [
        "#!/bin/bash",
        f"# trollout {__version__}: one collection run as {shards} Slurm array jobs, a shard each.",
        "#",
        f"#   sbatch {{this script}}                 every shard (array 0-{shards - 1})",
        "#   sbatch --array=3,5 {this script}     only shards 3 and 5; each resumes its folder",
        f"#   trollout status {shlex.quote(str(root))}",
        f"#   trollout aggregate {shlex.quote(glob)} -o {shlex.quote(str(output))}",
        "#",
        f"# Slurm sends SIGTERM {_SIGNAL_LEAD_S} s before the time limit: the job stops starting",
        "# rollouts, lets those in flight finish (--grace), writes everything down and exits 143;",
        "# submitting it again resumes the shard where it stopped.",
        f"#SBATCH --array=0-{shards - 1}",
        f"#SBATCH {shlex.quote(f'--chdir={workdir}')}",
        f"#SBATCH --signal=B:TERM@{_SIGNAL_LEAD_S}",
        *(f"#SBATCH {shlex.quote(option)}" for option in sbatch_options),
    ]
    body = [
        "set -euo pipefail",
        f"SHARDS={shards}",
        'ID="${SLURM_ARRAY_TASK_ID:?is not set: submit this script with sbatch}"',
        f'OUT="$(printf \'%s/%05d-of-%05d/%s\' {shlex.quote(str(root))} "$ID" "$SHARDS" '
        f'{shlex.quote(name)})"',
        f"exec {shlex.join(command)} \\",
        '  -o "$OUT" --shard "$ID/$SHARDS" --resume --no-aggregate --progress plain',
    ]
    return "\n".join([*header, *body]) + "\n"


def _refuse_controls(values: Sequence[tuple[str, str]]) -> None:
    """Refuse any value holding a control character: it could end its line of the script."""
    for what, value in values:
        if has_control(value):
            raise ConfigError(
                f"{what} '{visible(value)}' holds a control character (a newline would start a "
                "new line of the job script); remove it"
            )
