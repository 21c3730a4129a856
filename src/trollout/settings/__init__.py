"""Settings: the run record, its validation, and the one loader, in one package.

What. Everything trollout knows about a setting lives here: `RunConfig` (record.py), where each
field is one row giving its default, its check, its shape, and what the key is to the rest of
trollout (a NeMo Gym key, a plan key that is fingerprinted, a path, null-means-default:
fields.py); how a mapping becomes a validated record (build.py); the NeMo Gym key table
(keys.py), whose implemented rows are read off the record and the aggregate settings
(aggregation.py) and whose other rows say how trollout handles a key it does not implement;
the text of settings, YAML files, ``+key=value`` overrides and URLs, parsed as untrusted input
(syntax.py); numeric ranges (numbers.py); the one setting NeMo Gym derives from another
(derived.py); the rule the enrichment settings obey together, shared with
`trollout.enrichment` (enrichment.py); the cattrs converter (structure.py); and the loader
(loader.py).

One loader. `load_run_config` merges the sources of a run's settings, lowest first: defaults,
``config_paths`` files, ``--config``, a resumed run's saved settings, the command line. The
command line and the public `trollout.load_config` (`load_config`: the same without the notes
a command prints) call it with the same arguments and get the same `RunConfig` or the same
`ConfigError`. ``trollout aggregate`` has `load_aggregate_settings`, over the same sources
and key table.

Where a new key goes (docs/architecture.md's newcomer section):

- a NeMo Gym key trollout implements: one row in `RunConfig` (record.py) marked ``nemo=True``
  (plus ``plan=`` if it changes the materialized rows, a ``shape=`` if it is not a number or
  a flag), or one row in `aggregation.AGGREGATE_SETTINGS` for an aggregation key; then the
  code that uses it, and a test;
- a NeMo Gym key trollout handles its own way or does not support: one row in keys.py's
  `_OTHERS`, and a test;
- a setting of trollout's own: one row in `RunConfig`.

Layering: a leaf package. It imports nothing of trollout's but `trollout.errors` (and
itself), so every layer may read settings; what it needs from above is passed in (a resumed
run's saved settings are read from the manifest by the caller and given as ``saved``), or
checked by the caller: the health check ids (``health_check_ignored_checks``) are known to
`trollout.health`, so the command line and `trollout.load_config` check them with
`health.HealthSettings` after loading; here they are only given a shape.

Rejected: keeping the record in a leaf module and the NeMo Gym table with the command line's
loader in a second module that imported the run folder: the public `load_config` then took
the same arguments as the command line's loader and refused what it accepted
(``+route_failures_to_sidecar=true``, ``config_paths``), and a new NeMo Gym key touched four
to six files (the record, its shape table, the plan keys, the key table, aggregate's own
table, an option table). Also rejected: one module for all of it (1,700 lines), and deriving
the record from the key table (the record's types and defaults are what a reader looks up,
and attrs fields are where type checkers see them).
"""

from __future__ import annotations

from .aggregation import AGGREGATE_SETTINGS, AggregateSetting
from .build import build_config
from .derived import materialized_jsonl_fpath, materialized_problem, output_stem
from .enrichment import enrichment_problem
from .fields import FsyncPolicy, OutagePolicy, SeedMode, parse_shard, repeats_problems
from .keys import AGGREGATE, BY_NAME, COLLECT, KEYS, Handling, NemoKey, differences, translate
from .loader import (
    ALTERNATIVES,
    NEEDS,
    AggregateSettings,
    command_line,
    load_aggregate_settings,
    load_config,
    load_run_config,
    merge_config_paths,
)
from .numbers import (
    COUNT,
    DEFAULT_MAX_INPUT_LINE_BYTES,
    DEFAULT_METRICS_LINGER_S,
    DEFAULT_START_MIN_FRACTION,
    FRACTION,
    MAX_ATTEMPTS_ENV,
    MAX_SECONDS,
    PORT,
    POSITIVE_COUNT,
    POSITIVE_SECONDS,
    SECONDS,
    NumberRange,
    default_max_attempts,
)
from .record import (
    FIELD_NAMES,
    NULL_MEANS_DEFAULT,
    ORDER_KEYS,
    PATH_KEYS,
    PLAN_KEYS,
    TASKSET_NEEDS_ROUTES,
    RunConfig,
    converter,
)
from .saved import plan_differences, saved_as_started
from .syntax import (
    MAX_VALUE_DEPTH,
    head_server_url,
    load_yaml,
    parse_override,
    parse_value,
    read_settings_file,
    validate_url,
)

__all__ = [
    "AGGREGATE",
    "AGGREGATE_SETTINGS",
    "ALTERNATIVES",
    "BY_NAME",
    "COLLECT",
    "COUNT",
    "DEFAULT_MAX_INPUT_LINE_BYTES",
    "DEFAULT_METRICS_LINGER_S",
    "DEFAULT_START_MIN_FRACTION",
    "FIELD_NAMES",
    "FRACTION",
    "KEYS",
    "MAX_ATTEMPTS_ENV",
    "MAX_SECONDS",
    "MAX_VALUE_DEPTH",
    "NEEDS",
    "NULL_MEANS_DEFAULT",
    "ORDER_KEYS",
    "PATH_KEYS",
    "PLAN_KEYS",
    "PORT",
    "POSITIVE_COUNT",
    "POSITIVE_SECONDS",
    "SECONDS",
    "TASKSET_NEEDS_ROUTES",
    "AggregateSetting",
    "AggregateSettings",
    "FsyncPolicy",
    "Handling",
    "NemoKey",
    "NumberRange",
    "OutagePolicy",
    "RunConfig",
    "SeedMode",
    "build_config",
    "command_line",
    "converter",
    "default_max_attempts",
    "differences",
    "enrichment_problem",
    "head_server_url",
    "load_aggregate_settings",
    "load_config",
    "load_run_config",
    "load_yaml",
    "materialized_jsonl_fpath",
    "materialized_problem",
    "merge_config_paths",
    "output_stem",
    "parse_override",
    "parse_shard",
    "parse_value",
    "plan_differences",
    "read_settings_file",
    "repeats_problems",
    "saved_as_started",
    "translate",
    "validate_url",
]
