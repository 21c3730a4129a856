"""The text of settings: YAML files, ``+key=value`` overrides and URLs, parsed as untrusted input.

Values of overrides use Hydra's flow syntax: ``{host:127.0.0.1,port:11000}`` is a mapping,
``[a,b]`` a list, ``true``/``false``/``null``, numbers, and quoted or bare strings. YAML's own
flow syntax is not used because it reads ``{host:127.0.0.1}`` as a key with no value.

Untrusted structure (`load_yaml`, `parse_value`): YAML aliases of mappings and lists are
refused, since they are how a few hundred bytes expand into gigabytes of rows (scalar aliases
are kept), and YAML documents and override values nest at most `MAX_VALUE_DEPTH` levels, so
parsing cannot recurse without bound and a setting merged into a row keeps it within the rows'
own limit (`jsonl.MAX_DEPTH`). Every message names its source, the line or the key, and what to
do; `load_yaml(quote=False)` keeps the document's text out of messages for files that may hold
secrets (a head server's served config).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final
from urllib.parse import SplitResult, urlsplit

import yaml

from ..errors import ConfigError

__all__ = [
    "MAX_VALUE_DEPTH",
    "head_server_url",
    "load_yaml",
    "parse_override",
    "parse_value",
    "read_settings_file",
    "shown",
    "validate_url",
]

MAX_VALUE_DEPTH: Final = 100  # nesting of YAML documents and override values (module doc)


def shown(value: Any) -> str:
    """Return ``repr(value)`` cut to 200 characters, for messages."""
    text = repr(value)
    return text if len(text) <= 200 else text[:199] + "…"


def head_server_url(block: Mapping[str, Any]) -> str:
    """Return the URL of NeMo Gym's ``head_server: {host, port}`` block."""
    host = block.get("host", "127.0.0.1")
    port = block.get("port", 11000)
    return f"http://{host}:{port}"


def read_settings_file(
    path: str | os.PathLike[str], *, what: str = "config file"
) -> dict[str, Any]:
    """Read a YAML file of settings (a mapping; an empty file is no setting).

    Raises:
        ConfigError: the file cannot be read, is not YAML, or is not a mapping.
    """
    return _read_yaml(Path(path), what)


def _read_yaml(path: Path, what: str = "config file") -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"cannot read {what} {str(path)!r}: {reason}") from exc
    data = load_yaml(text, source=f"{what} {str(path)!r}")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {str(path)!r} must hold a mapping of settings")
    return data


# --- YAML and URLs ----------------------------------------------------------------------------


def load_yaml(text: str, *, source: str, quote: bool = True) -> Any:
    """Parse YAML safely, refusing aliases of mappings and lists and deep nesting.

    Args:
        text: the document.
        source: what it is, for messages (``"config file 'run.yaml'"``).
        quote: let messages carry the YAML parser's description of a syntax error, which may
            quote a few characters of the document; pass False for text that holds secrets.

    Raises:
        ConfigError: naming ``source``, the line and column, and what was refused.
    """
    loader = _BoundedLoader(text, quote=quote)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        problem = _yaml_problem(exc, quote, source)
    except (ValueError, LookupError, AttributeError, TypeError) as exc:
        # PyYAML's constructors raise plain errors that quote the value (`!!int sk-...`).
        problem = f"{source} holds a value YAML cannot build ({type(exc).__name__}); fix the YAML"
    finally:
        loader.dispose()
    # Raised outside `except`: a chained YAMLError's marks hold the document's text.
    raise ConfigError(problem)


def _yaml_problem(exc: yaml.YAMLError, quote: bool, source: str) -> str:
    # Plain concatenation: the parser's wording quotes the document (braces included).
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    if isinstance(exc, _RefusedYamlError):
        return f"{source} {exc.reason}{where}; {exc.remedy}"
    detail = getattr(exc, "problem", None) if quote else None
    said = f" ({detail})" if detail else ""
    return f"{source} is not valid YAML{where}{said}; fix the YAML"


class _RefusedYamlError(yaml.MarkedYAMLError):
    """A well-formed document that trollout refuses (reason and remedy are our own text)."""

    def __init__(self, reason: str, remedy: str, mark: Any) -> None:
        super().__init__(problem=reason, problem_mark=mark)
        self.reason = reason
        self.remedy = remedy


class _BoundedLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses aliases of collections, nesting past MAX_VALUE_DEPTH and
    a key given twice in one mapping.

    Composing is where the first two show: a scalar alias copies one value, a collection alias
    is how a billion-laughs document grows exponentially once serialized, and composing
    recurses once per level (RecursionError on a deep enough flow sequence). A duplicate key
    is legal to PyYAML, which keeps the last value: a setting written twice would silently
    take the second, so it is refused naming its line (and, when ``quote``, the key).
    """

    def __init__(self, stream: str, *, quote: bool = True) -> None:
        super().__init__(stream)
        self._depth = 0
        self._quote = quote

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                repeated = key in seen
            except TypeError:
                continue  # an unhashable key: the constructor refuses it itself
            if repeated:
                which = f"the key {shown(key)}" if self._quote else "a key"
                raise _RefusedYamlError(
                    f"has {which} twice in one mapping",
                    "keep one (YAML would silently take the last)",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep)

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event: Any = self.peek_event()  # type: ignore[no-untyped-call]  # untyped in the stubs
        if isinstance(event, yaml.AliasEvent):
            target = self.anchors.get(event.anchor)
            if isinstance(target, yaml.MappingNode | yaml.SequenceNode):
                raise _RefusedYamlError(
                    "uses an alias of a mapping or list",
                    "write the value out instead of *alias or <<: merge (only scalar aliases "
                    "are accepted: collection aliases expand without bound)",
                    event.start_mark,
                )
        elif isinstance(event, yaml.CollectionStartEvent) and self._depth >= MAX_VALUE_DEPTH:
            raise _RefusedYamlError(
                f"nests deeper than {MAX_VALUE_DEPTH} levels", "flatten it", event.start_mark
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def validate_url(url: str, *, what: str) -> str:
    """Return ``url`` without a trailing slash after checking it is ``http://host[:port]``.

    trollout speaks plain HTTP/1.1 (its own codec, no TLS), so ``https://`` is refused here,
    before anything is written, rather than failing every rollout later.

    Raises:
        ConfigError: naming ``what`` and the URL (unless it may carry credentials).
    """
    if "@" in url:
        raise ConfigError(f"{what} must not carry credentials (user:password@); remove them")
    parts = _split(url)
    if parts is not None and parts.scheme.lower() == "https":
        raise ConfigError(
            f"{what} must be a plain http:// URL (got {url!r}): trollout speaks HTTP/1.1 without "
            "TLS; use http://, or reach a TLS-only server through a local proxy or tunnel"
        )
    if parts is None or parts.scheme != "http" or not parts.hostname:
        raise ConfigError(
            f"{what} must be http://host:port with a port 1..65535 (got {url!r}); fix it"
        )
    if parts.query or parts.fragment:
        raise ConfigError(f"{what} must have no ?query or #fragment (got {url!r}); remove them")
    return url.rstrip("/")


def _split(url: str) -> SplitResult | None:
    try:
        parts = urlsplit(url)
        port = parts.port  # raises for a non-numeric or out-of-range port
    except ValueError:
        return None
    return None if port == 0 else parts


# --- +key=value overrides ---------------------------------------------------------------------


def parse_override(token: str) -> tuple[str, Any]:
    """Parse ``+key=value`` or ``++key=value`` (Hydra syntax) into a key and a value.

    Raises:
        ConfigError: the token has no ``=`` or no key.
    """
    body = token.lstrip("+")
    key, sep, raw = body.partition("=")
    if len(token) - len(body) not in (1, 2) or not sep or not key:
        raise ConfigError(f"override {token!r} must look like +key=value")
    try:
        value = parse_value(raw)
    except ConfigError as exc:
        raise ConfigError(f"override +{key.strip()}: {exc}") from None
    return key.strip(), value


def parse_value(text: str) -> Any:
    """Parse a Hydra-style value: mappings, lists, booleans, null, numbers, strings."""
    parser = _ValueParser(text)
    value = parser.value()
    parser.expect_end()
    return value


class _ValueParser:
    """A small recursive-descent parser for Hydra's override values."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.depth = 0

    def value(self) -> Any:
        self._skip()
        ch = self._peek()
        if ch and ch in "{[":
            return self._collection(ch)
        if ch and ch in "'\"":
            return self._quoted()
        return _scalar(self._bare())

    def expect_end(self) -> None:
        self._skip()
        if self.pos != len(self.text):
            raise ConfigError(f"cannot parse override value {self.text!r} near position {self.pos}")

    def _collection(self, opening: str) -> Any:
        # Each level is a recursive call: bound it before Python's recursion limit does.
        if self.depth >= MAX_VALUE_DEPTH:
            raise ConfigError(
                f"override value nests deeper than {MAX_VALUE_DEPTH} levels (at position "
                f"{self.pos}); flatten it"
            )
        self.depth += 1
        try:
            return self._mapping() if opening == "{" else self._list()
        finally:
            self.depth -= 1

    def _mapping(self) -> dict[str, Any]:
        self.pos += 1
        out: dict[str, Any] = {}
        while not self._eat("}"):
            key = self._quoted() if self._peek() in "'\"" else self._bare(stop=":}")
            if not self._eat(":"):
                raise ConfigError(f"expected ':' after key {key!r} in {self.text!r}")
            out[str(key).strip()] = self.value()
            self._eat(",")
        return out

    def _list(self) -> list[Any]:
        self.pos += 1
        out: list[Any] = []
        while not self._eat("]"):
            out.append(self.value())
            self._eat(",")
        return out

    def _quoted(self) -> str:
        quote = self.text[self.pos]
        end = self.text.find(quote, self.pos + 1)
        if end < 0:
            raise ConfigError(f"unterminated quote in override value {self.text!r}")
        value = self.text[self.pos + 1 : end]
        self.pos = end + 1
        return value

    def _bare(self, stop: str = ",]}") -> str:
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] not in stop:
            self.pos += 1
        return self.text[start : self.pos].strip()

    def _peek(self) -> str:
        if self.pos >= len(self.text):
            return ""
        return self.text[self.pos]

    def _eat(self, ch: str) -> bool:
        self._skip()
        if self.pos >= len(self.text):
            if ch in "}]":
                raise ConfigError(f"unclosed bracket in override value {self.text!r}")
            return False
        if self.text[self.pos] == ch:
            self.pos += 1
            self._skip()
            return True
        return False

    def _skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] == " ":
            self.pos += 1


def _scalar(text: str) -> Any:
    lowered = text.lower()
    if lowered in {"true", "false"}:
        return lowered == "true"
    if lowered in {"null", "none", "~"}:
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
