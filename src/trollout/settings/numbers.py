"""Numbers in settings: one validator (`NumberRange`) for every numeric setting, and its ranges.

Bools, NaN and infinities are refused everywhere. Integer settings take integers only: an
integral float such as ``1e9`` (what ``+key=1e9`` parses to) is refused with the integer to
write instead, rather than truncated, so ``1.5`` can never quietly become 1. Durations are at
most `MAX_SECONDS` (about 31 years; a bigger one can only mean "forever", which the optional
limits spell as unset), counts are below 2**63 and the seed below 2**64, the widest integers a
run folder's JSON holds. The dispatch and retry policies (collector/dispatch/) validate their
own fields with these same ranges.
"""

from __future__ import annotations

import math
import os
from typing import Any, Final

import attrs
from attrs import frozen

from ..errors import ConfigError

__all__ = [
    "COUNT",
    "DEFAULT_MAX_INPUT_LINE_BYTES",
    "DEFAULT_METRICS_LINGER_S",
    "DEFAULT_START_MIN_FRACTION",
    "FRACTION",
    "MAX_ATTEMPTS_ENV",
    "MAX_COUNT",
    "MAX_SECONDS",
    "PORT",
    "POSITIVE_COUNT",
    "POSITIVE_RATIO",
    "POSITIVE_SECONDS",
    "RATIO",
    "SECONDS",
    "SEED",
    "NumberRange",
    "default_max_attempts",
]

MAX_ATTEMPTS_ENV = "NEMO_GYM_MAX_ROLLOUT_ATTEMPTS"


def default_max_attempts() -> int:
    """Return the attempt cap from env NEMO_GYM_MAX_ROLLOUT_ATTEMPTS, else 3.

    Raises:
        ConfigError: the variable is set but is not an integer >= 1.
    """
    raw = os.environ.get(MAX_ATTEMPTS_ENV, "").strip()
    if not raw:
        return 3
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(
            f"{MAX_ATTEMPTS_ENV} must be an integer >= 1 (got {raw!r}); unset it or use e.g. 3"
        )
    return value


MAX_SECONDS: Final = 1e9  # about 31 years: any longer duration can only mean "no limit"
MAX_COUNT: Final = 2**63 - 1  # the widest signed integer a run folder's JSON holds
MAX_SEED: Final = 2**64 - 1  # the widest unsigned one (seeds are hashed as decimal text)
# The healthy share of rollouts started within dispatch_start_report_within_s. NeMo Gym's API
# reference gives the setting's type (a float, always judged) but not its default value.
DEFAULT_START_MIN_FRACTION: Final = 0.9
# A line holds one row; a 1M-token prompt is ~4 MB and rows with base64 images run to tens of
# MB, while a line is parsed whole (a few times its size in memory), so 64 MiB is generous for
# real data and still a bound; --max-line-bytes raises it.
DEFAULT_MAX_INPUT_LINE_BYTES: Final = 64 * 1024 * 1024
# How long the Prometheus endpoint serves a run's final values after the run: one scrape
# interval at Prometheus's own default (``scrape_interval``, default 1m), so a scraper left at
# its default sees them (trollout.telemetry.prometheus's design note).
DEFAULT_METRICS_LINGER_S: Final = 60.0


@frozen
class NumberRange:
    """An attrs validator for a numeric setting.

    It refuses bools, NaN and infinities, anything but an `int` when `integer` is set, and
    values outside ``[low, high]`` (or ``(low, high]`` with `low_open`); None only when
    `none_ok` (`or_none`: an optional setting, where None means unset).

    Attributes:
        what: what is expected, for messages (``"an integer >= 1"``).
    """

    what: str
    low: float
    high: float
    low_open: bool = False
    integer: bool = False
    none_ok: bool = False

    @property
    def or_none(self) -> NumberRange:
        """Return this range for an optional setting (None accepted)."""
        return attrs.evolve(self, none_ok=True)

    def __call__(self, instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        """Raise `ConfigError` naming the field when ``value`` is out of range."""
        if (value is None and self.none_ok) or self.accepts(value):
            return
        remedy = self._remedy(attribute, value)
        raise ConfigError(f"{attribute.name} must be {self.what} (got {value!r}); {remedy}")

    def accepts(self, value: Any) -> bool:
        """Return whether ``value`` is a number of the right kind within the range."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if self.integer and not isinstance(value, int):
            return False
        if isinstance(value, float) and not math.isfinite(value):
            return False
        above_low = self.low < value if self.low_open else self.low <= value
        return above_low and value <= self.high

    def _remedy(self, attribute: attrs.Attribute[Any], value: Any) -> str:
        integral = isinstance(value, float) and value.is_integer()
        if self.integer and integral and self.accepts(int(value)):
            return f"write it as an integer: {int(value)}"
        default = attribute.default
        if isinstance(default, int | float) and not isinstance(default, bool):
            return f"use e.g. {default!r} (the default)"
        return "fix the value, or leave it unset"


SECONDS: Final = NumberRange("a number of seconds from 0 to 1e9", 0, MAX_SECONDS)
POSITIVE_SECONDS: Final = NumberRange(
    "a number of seconds > 0 and at most 1e9", 0, MAX_SECONDS, low_open=True
)
FRACTION: Final = NumberRange("a number from 0 to 1", 0, 1)
RATIO: Final = NumberRange("a number from 0 to 1e9", 0, MAX_SECONDS)
POSITIVE_RATIO: Final = NumberRange("a number > 0 and at most 1e9", 0, MAX_SECONDS, low_open=True)
COUNT: Final = NumberRange("an integer from 0 to 2**63 - 1", 0, MAX_COUNT, integer=True)
POSITIVE_COUNT: Final = NumberRange("an integer from 1 to 2**63 - 1", 1, MAX_COUNT, integer=True)
SEED: Final = NumberRange("an integer from 0 to 2**64 - 1", 0, MAX_SEED, integer=True)
PORT: Final = NumberRange("a port from 0 to 65535 (0: any free port)", 0, 65535, integer=True)
