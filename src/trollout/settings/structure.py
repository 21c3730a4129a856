"""The cattrs converter that structures a mapping of settings into a `RunConfig`.

Values pass through as given where cattrs would coerce them (``int(1.5)`` is 1,
``bool("false")`` is True), so the field validators, which know the key, refuse the wrong
kind; an integer number of seconds becomes a float. `RunConfig.plan_fingerprint` and the
manifest unstructure with it too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import cattrs

from .numbers import MAX_COUNT

__all__ = ["converter"]

converter = cattrs.Converter(forbid_extra_keys=True)


def _structure_repeats(value: Any, _: Any) -> Any:
    # cattrs has no hook for `int | dict[str, int]`; values pass through and `repeats_problems`
    # refuses bad ones, naming the key.
    return dict(value) if isinstance(value, Mapping) else value


converter.register_structure_hook(int | dict[str, int], _structure_repeats)
converter.register_structure_hook(bool | dict[str, bool], _structure_repeats)
converter.register_structure_hook(str | int, lambda value, _: value)  # `task_ids_check` checks


def _as_given(value: Any, _: Any) -> Any:
    # cattrs would call int(), bool() or float() on the value: int(1.5) is 1, bool("false") is
    # True and float("nan") parses. Values pass through as given and the field validators,
    # which know the key, refuse the wrong kind.
    return value


def _as_float(value: Any, _: Any) -> Any:
    # An integer is a fine number of seconds (``+read_timeout_s=30``); keep the field a float.
    if type(value) is int and abs(value) <= MAX_COUNT:
        return float(value)
    return value


converter.register_structure_hook(int, _as_given)
converter.register_structure_hook(bool, _as_given)
converter.register_structure_hook(float, _as_float)
