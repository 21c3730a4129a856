"""`build_config`: a mapping of settings, from whatever source, into a validated `RunConfig`.

The one place a `RunConfig` is made from raw values (the loader's merged layers, a manifest's
saved settings, an embedding driver's mapping). In order: unknown keys are refused with the
closest known key suggested, so a typo never silently does nothing; a null that means the
default is dropped; each value's shape is checked on the raw value (`fields.Shape`); a
``{host, port}`` head server becomes its URL; cattrs structures the rest, and the field
validators and `RunConfig.validate` check it. A validator's `ConfigError` arrives wrapped by
cattrs; its own message, which names the key, is the one raised.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any, Final

import attrs
import cattrs

from ..errors import ConfigError
from .derived import materialized_problem
from .fields import Shape, row_of
from .record import FIELD_NAMES, NULL_MEANS_DEFAULT, RunConfig, converter
from .syntax import head_server_url, shown

__all__ = ["build_config", "unknown_key_message"]

_SHAPES: Final[dict[str, Shape]] = {
    a.name: shape for a in attrs.fields(RunConfig) if (shape := row_of(a).shape) is not None
}


def build_config(values: Mapping[str, Any]) -> RunConfig:
    """Structure a mapping of settings into a validated `RunConfig`.

    Raises:
        ConfigError: an unknown key, a value of the wrong shape or out of range, naming the key.
    """
    values = dict(values)
    unknown = sorted(set(values) - FIELD_NAMES)
    if unknown:
        raise ConfigError("; ".join(unknown_key_message(k) for k in unknown))
    for key in NULL_MEANS_DEFAULT & values.keys():
        if values[key] is None:
            del values[key]
    _check_shapes(values)
    if isinstance(values.get("head_server"), Mapping):
        values["head_server"] = head_server_url(values["head_server"])
    try:
        config = converter.structure(values, RunConfig)
    except ConfigError:
        raise
    except (cattrs.BaseValidationError, ValueError, TypeError) as exc:
        inner = _wrapped_config_error(exc)
        raise ConfigError(str(inner) if inner else _structure_message(exc)) from exc
    config.validate()
    if problem := materialized_problem(config.materialized_jsonl_fpath, config):
        raise ConfigError(problem)
    return config


def _check_shapes(values: Mapping[str, Any]) -> None:
    """Refuse a setting whose value has the wrong shape, naming the key and the shape."""
    for key, value in values.items():
        shape = _SHAPES.get(key)
        if shape is not None and not shape.accepts(value):
            raise ConfigError(
                f"{key} must be {shape.expected} (got {shown(value)}); "
                f"write e.g. +{key}={shape.example}"
            )


def unknown_key_message(key: str) -> str:
    """Return ``unknown setting 'key'`` with the closest known key, if one is close."""
    close = difflib.get_close_matches(key, FIELD_NAMES, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else "; see trollout collect --help"
    return f"unknown setting {key!r}{hint}"


def _wrapped_config_error(exc: BaseException) -> ConfigError | None:
    if isinstance(exc, ConfigError):
        return exc
    for inner in getattr(exc, "exceptions", ()):
        found = _wrapped_config_error(inner)
        if found is not None:
            return found
    return None


def _structure_message(exc: Exception) -> str:
    if isinstance(exc, cattrs.BaseValidationError):
        notes = cattrs.transform_error(exc)
        return "invalid settings: " + "; ".join(notes)
    return f"invalid settings: {exc}"
