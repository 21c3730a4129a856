"""``prompt_config``: a prompt template that builds each row's ``responses_create_params.input``.

NeMo Gym's prompt files (``nemo_gym.prompt``): a YAML mapping with ``user`` (required) and
``system`` (optional), each a ``str.format`` template whose ``{field}`` placeholders are filled
from the row's top-level fields (``{{`` and ``}}`` for literal braces). Applied to a row, it
sets ``responses_create_params.input`` to the system message (when given) and the user message;
the row's other ``responses_create_params`` fields are kept. A template and a row that already
has an ``input`` are mutually exclusive: such rows are refused, every one in one error, before
anything is written. Task identity is still the input line, as in NeMo Gym.

Differences from NeMo Gym: a relative path is taken from the current folder (NeMo Gym resolves
it against its install root, which trollout does not have). The file must be a regular file
(a FIFO or a device is refused before it is opened, so it cannot block the run) of at most
`MAX_PROMPT_BYTES` (1 MiB, far more than any template needs), so an endless file is refused
once the bound is read instead of filling memory.

Expansion is bounded (`PromptTemplate.expand`). A template repeats its fields at will, so a few
kilobytes of rows can expand into gigabytes of messages (a ``{question}`` written 10,000 times),
and every expanded row is a line of the materialized inputs, which the run, its resume and
``aggregate`` read back under the input line limit (``max_input_line_bytes``, 64 MiB by default).
So an expanded row is held to that limit: the row's own line plus the JSON the messages add (each
piece as JSON escapes it, and the few bytes of the ``input`` list around them). The messages are
built piece by piece (a literal run of the template, or one filled field) and counted as they
grow; the first piece that passes the limit stops the expansion and the row is refused, naming
file, line and the limit, before anything is written. A field's width or precision
(``{q:>100000000}``, ``{x:.100000000f}``) counts as that many bytes before the piece is formatted,
so no single piece is built past the limit either; a precision that only truncates (a string's)
does not count. Memory is therefore the limit plus one piece, whatever the template. Planning
counts each row's expanded size in the plan's ``materialized_bytes``, which the free-space check
compares with the output disk. A field the row cannot fill (``{q.x}`` on a string, ``{n:d}`` on
text) refuses the row, naming the placeholder.

Rejected: building the messages with ``str.format_map`` and measuring the result (what trollout
did first): the one call builds the whole expansion, so the limit is checked only after memory
has already held it (1.27 GB for 6 KB of input, or a ``MemoryError``). Rejected too: a fixed cap
on the template's fields or repetitions: it refuses harmless templates over small rows and still
lets a few repeats of a large field through; the line limit is the bound the rows already obey.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from typing import Any, Final, NamedTuple

import orjson
from attrs import frozen

from ...errors import ConfigError
from ...paths import regular_file
from ...settings import load_yaml

__all__ = ["MAX_PROMPT_BYTES", "Expansion", "PromptTemplate", "load_prompt"]

PARAMS: Final = "responses_create_params"
_KEYS: Final = frozenset({"user", "system"})
MAX_PROMPT_BYTES: Final = 1 << 20  # a prompt file's bound (module docstring)
_REMEDY: Final = "save the prompt template to a file and pass that"
# What the messages add around their contents, at most: `,"responses_create_params":{"input":[]}`
# and one `{"role":"system","content":""},` per message.
_FRAME_BYTES: Final = len(b',"responses_create_params":{"input":[]}')
# [[fill]align][sign][z][#][0][width][grouping][.precision][type]: the width and the precision.
_SPEC: Final = re.compile(r"(?:.?[<>=^])?[-+ ]?z?#?0?(\d*)[,_]?(?:\.(\d+))?")
_FORMATTER: Final = string.Formatter()


class Expansion(NamedTuple):
    """A row as the template builds it, or why it cannot be built.

    Attributes:
        row: the built row (None when there is a problem, or when only measuring).
        size: the expanded row's size in bytes, about: its line plus what the messages add
            (past the limit, the size counted when the expansion stopped).
        problem: why the row cannot be built (too large, a field it cannot fill), or None.
    """

    row: dict[str, Any] | None
    size: int
    problem: str | None


class _OverLimitError(Exception):
    """The expansion passed its limit (internal: `PromptTemplate.expand` reports it)."""


class _Budget:
    """Counts the bytes the messages add, refusing the first piece that passes the limit."""

    def __init__(self, used: int, limit: int) -> None:
        self.used = used
        self.limit = limit

    def reserve(self, size: int) -> None:
        """Refuse a piece that will take ``size`` bytes at least, before it is built."""
        if self.used + size > self.limit:
            self.used += size
            raise _OverLimitError

    def take(self, size: int) -> None:
        """Count a built piece of ``size`` bytes (refused when it passes the limit)."""
        self.reserve(size)
        self.used += size


@frozen
class PromptTemplate:
    """A loaded prompt file: the ``user`` template and an optional ``system`` one."""

    user: str
    system: str | None = None
    source: str = "prompt_config"

    def check(self, row: Mapping[str, Any]) -> str | None:
        """Return why the template cannot build this row's input, or None."""
        params = row.get(PARAMS)
        if isinstance(params, Mapping) and params.get("input"):
            return (
                f"the row has {PARAMS}.input and prompt_config {self.source} builds it too "
                "(they are mutually exclusive); drop the rows' input or the prompt_config"
            )
        missing = sorted(self._fields() - row.keys())
        if missing:
            return (
                f"prompt_config {self.source} fills {{{missing[0]}}} but the row has no field "
                f"{missing[0]!r}; add it to the rows or fix the template"
            )
        return None

    def expand(
        self, row: Mapping[str, Any], *, row_bytes: int, max_bytes: int, keep: bool = True
    ) -> Expansion:
        """Build the row's ``responses_create_params.input``, held to ``max_bytes`` (docstring).

        Args:
            row: the row, which `check` accepted.
            row_bytes: the row's own size as a line (what the messages are added to).
            max_bytes: the limit of the expanded row (the input line limit).
            keep: False only counts (the size of an accepted row, without building it): one
                piece is held at a time.
        """
        roles = ([] if self.system is None else [("system", self.system)]) + [("user", self.user)]
        frame = _FRAME_BYTES + sum(_message_frame(role) for role, _ in roles)
        budget = _Budget(row_bytes + frame, max_bytes)
        messages = []
        try:
            for role, template in roles:
                content = _fill(template, row, budget, keep)
                messages.append({"role": role, "content": content})
        except _OverLimitError:
            return Expansion(None, budget.used, self._too_large(max_bytes))
        except _UnfillableError as exc:
            return Expansion(None, budget.used, str(exc).format(source=self.source))
        if not keep:
            return Expansion(None, budget.used, None)
        params = row.get(PARAMS)
        built = dict(params) if isinstance(params, Mapping) else {}
        built["input"] = messages
        return Expansion({**row, PARAMS: built}, budget.used, None)

    def _too_large(self, max_bytes: int) -> str:
        return (
            f"prompt_config {self.source} expands this row past {max_bytes:,} bytes (the input "
            "line limit); shorten the template or the row's fields, or raise --max-line-bytes "
            "(+max_input_line_bytes)"
        )

    def _fields(self) -> set[str]:
        texts = [self.user] + ([self.system] if self.system is not None else [])
        return {_root(name) for text in texts for _, name, _, _ in _parse(text) if name}


class _UnfillableError(Exception):
    """A placeholder the row cannot fill (the message has a ``{source}`` slot)."""


def _fill(template: str, row: Mapping[str, Any], budget: _Budget, keep: bool) -> str:
    """Fill ``template`` from ``row`` piece by piece, counting each piece in ``budget``.

    Raises:
        _OverLimitError: a piece would pass the budget's limit (it is not built when its width or
            precision already does).
        _UnfillableError: a placeholder the row cannot fill.
    """
    parts: list[str] = []
    for literal, field, spec, conversion in _FORMATTER.parse(template):
        if literal:
            _count(budget, literal, parts, keep)
        if field is None:
            continue
        try:
            value, _ = _FORMATTER.get_field(field, (), row)
            value = _FORMATTER.convert_field(value, conversion)
            spec = _FORMATTER.vformat(spec, (), row) if spec and "{" in spec else spec or ""
            budget.reserve(_spec_bytes(spec, value))
            piece = format(value, spec)
        except _OverLimitError:
            raise
        except (LookupError, AttributeError, ValueError, TypeError, OverflowError) as exc:
            raise _UnfillableError(
                f"prompt_config {{source}} cannot fill {{{{{field}}}}} from this row "
                f"({type(exc).__name__}); fix the template or the row's field"
            ) from None
        _count(budget, piece, parts, keep)
    return "".join(parts)


def _count(budget: _Budget, piece: str, parts: list[str], keep: bool) -> None:
    try:
        size = len(orjson.dumps(piece)) - 2
    except orjson.JSONEncodeError:
        raise _UnfillableError(
            "prompt_config {source} builds text that is not valid Unicode for this row; fix "
            "the template or the row"
        ) from None
    budget.take(size)
    if keep:
        parts.append(piece)


def _spec_bytes(spec: str, value: Any) -> int:
    """Return the bytes a format spec makes a piece at least take: its width, or precision.

    A string's precision truncates it, so only a number's counts. Digits too many to read
    count as more than any limit.
    """
    match = _SPEC.match(spec)
    if match is None:
        return 0
    width, precision = match.group(1), match.group(2)
    if isinstance(value, str):
        precision = None
    return max(_digits(width), _digits(precision))


def _digits(text: str | None) -> int:
    if not text:
        return 0
    return int(text) if len(text) <= 18 else 10**18


def _message_frame(role: str) -> int:
    return len(orjson.dumps({"role": role, "content": ""})) + 1  # and a comma


def _parse(text: str) -> list[tuple[str, str | None, str | None, str | None]]:
    return list(_FORMATTER.parse(text))


def _root(field: str) -> str:
    """Return the row field a placeholder reads (``{a.b}`` and ``{a[0]}`` read ``a``)."""
    for mark in ".[":
        field = field.split(mark, 1)[0]
    return field


def load_prompt(path: str) -> PromptTemplate:
    """Load and check a prompt file (``user`` required, ``system`` optional).

    Raises:
        ConfigError: the file cannot be read, is not such a mapping, or holds a bad template.
    """
    shown = repr(path)
    data = load_yaml(_read_prompt(path, shown), source=f"prompt_config {shown}")
    if not isinstance(data, dict) or not isinstance(data.get("user"), str):
        raise ConfigError(
            f"prompt_config {shown} must be a mapping with a 'user' template (a string) and an "
            "optional 'system' one; fix the file"
        )
    unknown = sorted(set(map(str, data)) - _KEYS)
    system = data.get("system")
    if unknown or not (system is None or isinstance(system, str)):
        what = f"unknown key {unknown[0]!r}" if unknown else "a 'system' that is not a string"
        raise ConfigError(f"prompt_config {shown} has {what}; keep only 'user' and 'system'")
    for name, template in (("user", data["user"]), ("system", system)):
        if template is not None:
            _check_template(shown, name, template)
    return PromptTemplate(data["user"], system, shown)


def _read_prompt(path: str, shown: str) -> str:
    """Read a prompt file: a regular file (checked before opening) of at most the bound."""
    regular_file(path, "prompt_config", _REMEDY, expected="a YAML file")
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_PROMPT_BYTES + 1)
        if len(data) > MAX_PROMPT_BYTES:
            raise ConfigError(
                f"prompt_config {shown} is larger than {MAX_PROMPT_BYTES:,} bytes (the prompt "
                "file limit); a prompt template is a small YAML file: check the path"
            )
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"cannot read prompt_config {shown}: {reason}; check the path") from exc


def _check_template(shown: str, name: str, template: str) -> None:
    try:
        fields = [field for _, field, _, _ in _parse(template) if field is not None]
    except ValueError as exc:
        raise ConfigError(
            f"prompt_config {shown}: the {name!r} template is not a valid format string "
            f"({exc}); write literal braces as {{{{ and }}}}"
        ) from None
    if any(not field or field.isdigit() for field in fields):
        raise ConfigError(
            f"prompt_config {shown}: the {name!r} template has a positional placeholder; name "
            "the row's field, e.g. {question}"
        )
