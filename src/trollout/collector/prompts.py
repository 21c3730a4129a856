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
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Any, Final

from attrs import frozen

from ..config import load_yaml
from ..errors import ConfigError
from .plan_input import regular_file

__all__ = ["MAX_PROMPT_BYTES", "PromptTemplate", "load_prompt"]

PARAMS: Final = "responses_create_params"
_KEYS: Final = frozenset({"user", "system"})
MAX_PROMPT_BYTES: Final = 1 << 20  # a prompt file's bound (module docstring)
_REMEDY: Final = "save the prompt template to a file and pass that"


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

    def apply(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """Return a copy of the row whose ``responses_create_params.input`` the template built."""
        messages = [] if self.system is None else [_message("system", self.system, row)]
        messages.append(_message("user", self.user, row))
        params = row.get(PARAMS)
        built = dict(params) if isinstance(params, Mapping) else {}
        built["input"] = messages
        return {**row, PARAMS: built}

    def _fields(self) -> set[str]:
        texts = [self.user] + ([self.system] if self.system is not None else [])
        return {_root(name) for text in texts for _, name, _, _ in _parse(text) if name}


def _message(role: str, template: str, row: Mapping[str, Any]) -> dict[str, str]:
    return {"role": role, "content": template.format_map(row)}


def _parse(text: str) -> list[tuple[str, str | None, str | None, str | None]]:
    return list(string.Formatter().parse(text))


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
