"""Module size: a module says what it is about, and a long one says why it stays whole.

A module over `LIMIT` lines holds two concerns more often than not; split it, or put a note
saying why it stays whole where a reader sees it first: a comment at the top of the file or the
first line of its docstring, holding `MARKER` (``# Stays whole: one state machine ...``). The
command line is held to `CLI_LIMIT`: it parses and prints, and composes nothing.

Rejected alternative: a list of exempt modules kept here. The reason then lives away from the
code it excuses and outlives it; a note at the top of the module is read, and moved, with it.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "trollout"
LIMIT = 400
CLI_LIMIT = 250
MARKER = "Stays whole:"


def line_count(path: Path) -> int:
    """Return the number of lines of a file (as ``wc -l`` counts them)."""
    return path.read_text(encoding="utf-8").count("\n")


def first_note(path: Path) -> str:
    """Return the comment lines above the module docstring and the docstring's first line."""
    text = path.read_text(encoding="utf-8")
    comments = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        comments.append(line)
    docstring = ast.get_docstring(ast.parse(text)) or ""
    return "\n".join([*comments, docstring.partition("\n")[0]])


def long_modules(limit: int, root: Path = SRC) -> list[str]:
    """Return every module under `root` longer than `limit` lines with no `MARKER` note."""
    found = []
    for path in sorted(root.rglob("*.py")):
        name = path.relative_to(root).as_posix()
        lines = line_count(path)
        if lines > limit and MARKER not in first_note(path):
            found.append(f"{name}: {lines} lines, no {MARKER!r} note at its top")
    return found


def test_module_size_note_is_read_from_the_top(tmp_path: Path) -> None:
    """A guard on the guard: the note counts at the top (a comment or the docstring's first
    line), and nowhere else."""
    long_body = "x = 1\n" * (LIMIT + 1)
    cases = {
        "comment.py": f"# {MARKER} a codec.\n" + '"""A codec."""\n' + long_body,
        "docstring.py": f'"""A codec. {MARKER} one state machine."""\n' + long_body,
        "buried.py": f'"""A codec.\n\n{MARKER} too late."""\n' + long_body,
        "bare.py": '"""A codec."""\n' + long_body,
        "short.py": '"""A codec."""\nx = 1\n',
    }
    for name, text in cases.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    flagged = {line.partition(":")[0] for line in long_modules(LIMIT, tmp_path)}
    assert flagged == {"buried.py", "bare.py"}


def test_modules_are_at_most_400_lines_or_say_why_they_stay_whole() -> None:
    """Every module of src/trollout is at most 400 lines, or says at its top why it stays whole."""
    assert long_modules(LIMIT) == []


def test_cli_modules_are_at_most_250_lines() -> None:
    """The command line parses and prints: no module of cli/ is over 250 lines, note or not."""
    too_long = [
        f"{path.relative_to(SRC).as_posix()}: {line_count(path)} lines"
        for path in sorted((SRC / "cli").rglob("*.py"))
        if line_count(path) > CLI_LIMIT
    ]
    assert too_long == []
