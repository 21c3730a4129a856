"""`RunConfig`: every setting of a run, one row each, and the tables read off the rows.

Field names are NeMo Gym's config keys where NeMo Gym has the setting (so ``+num_repeats=4``
and ``num_repeats: 4`` in a YAML file mean what they mean in NeMo Gym), plus trollout's own.
Each field is a `fields.setting` row: default, check, shape and what the key is to the rest of
trollout (`fields.Row`). `PLAN_KEYS`, `PATH_KEYS`, `ORDER_KEYS`, `NULL_MEANS_DEFAULT` and the
implemented rows of the NeMo Gym key table (`keys.KEYS`) are derived from the rows here.

Validation happens once, in the field validators and `RunConfig.validate` (cross-field rules);
every message names the key, shows the value and says what was expected.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Final

import attrs
import orjson
from attrs import frozen

from ..errors import ConfigError
from .enrichment import enrichment_problem
from .fields import (
    AGENT_MAP,
    FAN_OUT,
    HEAD,
    IGNORED_CHECKS,
    OBJECT,
    OPTIONAL_LIST,
    OPTIONAL_STR_LIST,
    REPEATS,
    ROUTING_MODE,
    SEEDS,
    FsyncPolicy,
    OutagePolicy,
    SeedMode,
    flag,
    fsync_of,
    name,
    outage_of,
    path,
    repeats_problems,
    row_of,
    seed_mode_of,
    seed_setting_check,
    setting,
    shard_check,
    str_list,
    str_map,
    task_ids_check,
)
from .numbers import (
    COUNT,
    DEFAULT_MAX_INPUT_LINE_BYTES,
    DEFAULT_METRICS_LINGER_S,
    DEFAULT_START_MIN_FRACTION,
    FRACTION,
    PORT,
    POSITIVE_COUNT,
    POSITIVE_RATIO,
    POSITIVE_SECONDS,
    RATIO,
    SECONDS,
    SEED,
    default_max_attempts,
)
from .structure import converter
from .syntax import validate_url

__all__ = [
    "FIELD_NAMES",
    "NULL_MEANS_DEFAULT",
    "ORDER_KEYS",
    "PATH_KEYS",
    "PLAN_KEYS",
    "TASKSET_NEEDS_ROUTES",
    "RunConfig",
    "converter",
]

_URLS: Final = "a list of URLs"


@frozen(kw_only=True)
class RunConfig:
    """Every setting of a collection run (NeMo Gym key names where NeMo Gym has the setting).

    Attributes are documented in ``trollout collect --help`` and docs/user-guide.md; the groups
    are input and output, deployment, preprocessing (docs/protocol.md section 5), dispatch and
    durability.
    """

    # input and output
    input_jsonl_fpath: str | None = setting(None, shape=path("data/in.jsonl"), nemo=True, path=True)
    output_jsonl_fpath: str | None = setting(
        None, shape=path("out/rollouts.jsonl"), nemo=True, path=True
    )
    materialized_jsonl_fpath: str | None = setting(
        None, shape=path("m.jsonl"), nemo=True, path=True
    )
    max_input_line_bytes: int = setting(DEFAULT_MAX_INPUT_LINE_BYTES, POSITIVE_COUNT)
    # deployment
    head_server: str | None = setting(None, shape=HEAD)
    agent_urls: dict[str, str] = setting(
        factory=dict,
        shape=str_map("a mapping of agent names to URLs", "{math:'http://h:1'}"),
        null_default=True,
    )
    # environment variables a head server's config may read (served_config: none by default)
    served_config_env_allow: list[str] = setting(
        factory=list,
        shape=str_list("a list of environment variable names", "[HEAD_HOST]"),
        null_default=True,
    )
    # preprocessing (these change what is dispatched, so they are fingerprinted: `plan`)
    agent_name: str | None = setting(
        None, shape=name("an agent name (a string)", "math_agent"), nemo=True, plan=0
    )
    agent_map: dict[str, str] = setting(
        factory=dict, shape=AGENT_MAP, nemo=True, plan=0, null_default=True
    )
    fan_out: dict[str, list[str]] = setting(
        factory=dict, shape=FAN_OUT, nemo=True, plan=0, null_default=True
    )
    num_repeats: int | dict[str, int] = setting(
        1, shape=REPEATS, nemo=True, plan=0, null_default=True
    )
    # True, False, or {agent: bool, _default: bool}: which agents' rollouts get seeds
    num_repeats_add_seed: bool | dict[str, bool] = setting(
        False, seed_setting_check, shape=SEEDS, nemo=True, plan=0
    )
    seed: int = setting(0, SEED, plan=0)
    # NeMo Gym's seeds (the rollout index) by default; a run saved without the key was started
    # under the old default, hash, and resumes with it
    seed_mode: SeedMode = setting(
        SeedMode.ROLLOUT_INDEX, converter=seed_mode_of, plan=0, absent=SeedMode.HASH
    )
    limit: int | None = setting(None, COUNT.or_none, nemo=True, plan=0)
    task_ids: list[str | int] | None = setting(
        None, task_ids_check, shape=OPTIONAL_LIST, nemo=True, plan=0
    )
    # "I/N": keep the tasks whose identity hashes to shard I of N (task_selection.py)
    shard: str | None = setting(None, shard_check, plan=2)
    # a prompt YAML: builds responses_create_params.input
    prompt_config: str | None = setting(
        None,
        shape=path("prompts/math.yaml", "a path to a prompt YAML file"),
        nemo=True,
        plan=1,
        path=True,
    )
    interleave_repeats: bool = setting(False, flag, nemo=True, plan=0, order=True)
    round_robin_agents: bool = setting(False, flag, plan=0, order=True)
    responses_create_params: dict[str, Any] = setting(
        factory=dict, shape=OBJECT, nemo=True, plan=0, null_default=True
    )
    environment_routing_mode: str = setting("agent", shape=ROUTING_MODE, nemo=True, plan=0)
    environment_server_name: str | None = setting(
        None, shape=name("a server name (a string)", "math_env"), nemo=True, plan=0
    )
    environment_server_routes: dict[str, str] = setting(
        factory=dict,
        shape=str_map("a mapping of tasksets to servers", "{ts:env}"),
        nemo=True,
        plan=0,
        null_default=True,
    )
    # dispatch
    num_samples_in_parallel: int = setting(64, POSITIVE_COUNT, nemo=True, null_default=True)
    max_resident_rollout_tasks: int | None = setting(None, POSITIVE_COUNT.or_none, nemo=True)
    connect_timeout_s: float = setting(10.0, POSITIVE_SECONDS)
    read_timeout_s: float = setting(3600.0, POSITIVE_SECONDS)
    # the longest one /run request may take, sending through the last reply byte, however
    # steadily bytes trickle in; None: twice read_timeout_s (7200 s by default)
    reply_timeout_s: float | None = setting(None, POSITIVE_SECONDS.or_none)
    max_reply_bytes: int = setting(256 * 1024 * 1024, POSITIVE_COUNT)
    # a 200 whose echoed responses_create_params.input is another conversation is
    # identity_mismatch (collector/classify/outcomes.py); false for agents that rewrite their input
    check_echoed_input: bool = setting(True, flag)
    max_rollouts: int = setting(10_000_000, POSITIVE_COUNT)  # a plan's size
    # the outage grace: an endpoint that gave no answer this long is down (dispatch/retry.py)
    dispatch_connect_grace_s: float = setting(30.0, SECONDS, nemo=True)
    max_connect_retries: int = setting(4, COUNT)  # own, per attempt
    on_endpoint_outage: OutagePolicy = setting(OutagePolicy.STOP, converter=outage_of)
    fail_fast: bool = setting(False, flag)
    # budget, drain and the run's wall clock (docs/protocol.md section 9); a budget of 0 starts
    # nothing (the engine's documented meaning), which the CLI refuses as an empty run
    dispatch_budget_s: float | None = setting(None, SECONDS.or_none, nemo=True)
    drain_margin_s: float | None = setting(None, SECONDS.or_none, nemo=True)
    max_run_time_s: float | None = setting(None, POSITIVE_SECONDS.or_none)
    grace_s: float = setting(30.0, SECONDS)
    # run-level stops: conditions no retry can fix
    stop_after_auth_failures: int | None = setting(5, POSITIVE_COUNT.or_none)
    environment_protocol_violation_stop_after: int | None = setting(
        5, POSITIVE_COUNT.or_none, nemo=True
    )
    require_complete: bool = setting(False, flag, nemo=True)
    # retries, budgets, breaker and the per-rollout limit (dispatch/retry.py design note)
    retry_requests: bool = setting(False, flag)  # new attempt numbers
    max_request_retries: int = setting(3, COUNT)  # per rollout
    retry_backoff_base_s: float = setting(0.5, SECONDS)
    retry_backoff_max_s: float = setting(30.0, SECONDS)
    retry_budget_per_endpoint: int = setting(100, COUNT)  # a count
    breaker_failure_threshold: int = setting(5, POSITIVE_COUNT)
    breaker_open_s: float = setting(5.0, POSITIVE_SECONDS)  # the longest
    rollout_timeout_s: float | None = setting(None, POSITIVE_SECONDS.or_none)
    timeout_is_terminal: bool = setting(False, flag)
    # the run timing report (docs/protocol.md section 9; collector/engine/timing.py)
    server_queue_metrics_urls: list[str] = setting(
        factory=list,
        shape=str_list(_URLS, "['http://h:8000']"),
        nemo=True,
        null_default=True,
    )
    server_queue_sample_interval_s: float = setting(10.0, POSITIVE_SECONDS, nemo=True)
    server_queue_max_waiting_ratio: float = setting(1.0, RATIO, nemo=True)
    timing_summary_interval_s: float | None = setting(300.0, POSITIVE_SECONDS.or_none, nemo=True)
    # unset: the start row reports no window; the fraction is judged once a window is set
    dispatch_start_report_within_s: float | None = setting(None, SECONDS.or_none, nemo=True)
    # saved as null by runs made before it had one: null is the default
    dispatch_start_report_min_fraction: float = setting(
        DEFAULT_START_MIN_FRACTION, FRACTION, nemo=True, null_default=True
    )
    dispatch_all_started_within_s: float | None = setting(None, POSITIVE_SECONDS.or_none, nemo=True)
    timed_out_max_fraction: float = setting(0.01, FRACTION, nemo=True)
    long_rollout_s: float | None = setting(None, POSITIVE_SECONDS.or_none, nemo=True)
    long_rollout_max_fraction: float = setting(0.05, FRACTION, nemo=True)
    straggler_p90_multiple: float = setting(3.0, POSITIVE_RATIO)
    # a run on a Ray cluster (trollout.scaleout): its address ("local": a cluster of this
    # machine's own), the blocks in flight at once, and the blocks the plan is cut into (fixed
    # when the run starts, so a resume with another worker count finds the same block folders)
    ray_address: str | None = None
    ray_workers: int | None = setting(None, POSITIVE_COUNT.or_none)
    ray_blocks: int | None = setting(None, POSITIVE_COUNT.or_none)
    # durability and reporting
    fsync: FsyncPolicy = setting(FsyncPolicy.BATCH, converter=fsync_of)
    fsync_every_rows: int = setting(256, POSITIVE_COUNT)
    fsync_every_s: float = setting(1.0, POSITIVE_SECONDS)
    status_interval_s: float = setting(2.0, POSITIVE_SECONDS)
    record_omitted_rollouts: bool = setting(False, flag, nemo=True)
    disable_aggregation: bool = setting(False, flag, nemo=True)
    # the post-run rollout health check (trollout.health, which checks the ids: its callers ask)
    disable_health_check: bool = setting(False, flag, nemo=True)
    health_check_workers: int | None = setting(None, POSITIVE_COUNT.or_none, nemo=True)
    health_check_ignored_checks: Any = setting(
        factory=list, shape=IGNORED_CHECKS, nemo=True, null_default=True
    )
    count_failure_classes_as_zero: list[str] | None = setting(
        None, shape=OPTIONAL_STR_LIST, nemo=True
    )
    count_missing_rollouts_as_zero: bool = setting(False, flag, nemo=True)
    # a NeMo Gym batch manifest: members checked before dispatch, batch_status.json beside it
    batch_manifest_fpath: str | None = setting(
        None, shape=path("batch.json", "a path to a batch manifest"), nemo=True, path=True
    )
    # resume and attempts (docs/protocol.md section 8); none changes the materialized rows, so none
    # is fingerprinted: raising the cap or retrying terminal timeouts on resume is legitimate
    resume_from_cache: bool = setting(False, flag, nemo=True)
    # resume, and send again what is done without having landed (``trollout resubmit``)
    resubmit: bool = setting(False, flag, nemo=True)
    overwrite: bool = setting(False, flag)  # a fresh run may replace one
    allow_unsafe_resume: bool = setting(False, flag, nemo=True)
    max_attempts: int = setting(factory=default_max_attempts, check=POSITIVE_COUNT)
    retry_terminal_timeouts: bool = setting(False, flag, nemo=True)
    # resume dispatches retryable failures (false: only what never finished; sbatch's tasks)
    retry_failed_on_resume: bool = setting(True, flag)
    dispatch_longest_first: bool = setting(False, flag, nemo=True)
    # telemetry (trollout.telemetry; the OTEL_* environment variables configure the rest)
    otlp_endpoint: str | None = None  # OTLP/HTTP base URL (OTEL_EXPORTER_OTLP_ENDPOINT's role)
    metrics_port: int | None = setting(None, PORT.or_none)  # Prometheus
    metrics_host: str = "127.0.0.1"  # where the Prometheus endpoint binds
    # how long the endpoint serves the final values after the run (0: close at once)
    metrics_linger_s: float = setting(DEFAULT_METRICS_LINGER_S, SECONDS)
    metrics_pushgateway: str | None = setting(  # push the final values here at the end
        None, shape=name("a Pushgateway URL", "http://127.0.0.1:9091")
    )
    # enrichment (trollout.enrichment): model-call capture merged into each landed row
    observability_enabled: bool = setting(False, flag)
    model_call_capture_dir: str | None = setting(  # required with observability_enabled
        None, shape=path("/srv/gym/model-calls", "an absolute path")
    )
    include_model_call_payloads: bool = setting(True, flag)
    delete_model_call_capture: bool = setting(False, flag)

    @property
    def resident_rollouts(self) -> int:
        """Workers to run: `max_resident_rollout_tasks`, or the concurrency."""
        return self.max_resident_rollout_tasks or self.num_samples_in_parallel

    def validate(self) -> None:
        """Check cross-field rules that single-field validators cannot.

        Raises:
            ConfigError: naming the key, the value and the remedy.
        """
        problems = repeats_problems(self.num_repeats)
        if problems:
            raise ConfigError("; ".join(problems))
        self._check_urls()
        if self.environment_routing_mode not in {"agent", "legacy", "taskset"}:
            raise ConfigError(
                f"environment_routing_mode must be one of agent, legacy, taskset "
                f"(got {self.environment_routing_mode!r})"
            )
        if self.environment_routing_mode == "legacy" and not self.environment_server_name:
            raise ConfigError(
                "environment_routing_mode 'legacy' needs environment_server_name; set "
                "+environment_server_name=<server>"
            )
        if self.environment_routing_mode == "taskset" and not self.environment_server_routes:
            raise ConfigError(TASKSET_NEEDS_ROUTES)
        enrichment = enrichment_problem(
            self.observability_enabled,
            self.model_call_capture_dir,
            self.include_model_call_payloads,
            self.delete_model_call_capture,
        )
        if enrichment is not None:
            raise ConfigError(enrichment)

    def _check_urls(self) -> None:
        for agent, url in self.agent_urls.items():
            validate_url(url, what=f"URL of agent {agent!r}")
        if self.head_server is not None:
            validate_url(self.head_server, what="head server URL")
        for url in self.server_queue_metrics_urls:
            validate_url(url, what="server_queue_metrics_urls entry")

    def plan_fingerprint(self) -> str:
        """Return sha256 of the settings that change what is dispatched.

        A key added to `PLAN_KEYS` after runs were made is hashed only when it is not at its
        default, so the fingerprint of a run that never used it stays what it was.
        """
        plan = {
            key: converter.unstructure(getattr(self, key))
            for key in PLAN_KEYS
            if key not in _LATER_PLAN_KEYS or getattr(self, key) != _DEFAULTS[key]
        }
        return hashlib.sha256(orjson.dumps(plan, option=orjson.OPT_SORT_KEYS)).hexdigest()

    def planned_as_is(self) -> RunConfig:
        """Return these settings, every `PLAN_KEYS` one at its default (`run.shards`)."""
        return attrs.evolve(
            self, **{a.name: _default_of(a) for a in _FIELDS if a.name in PLAN_KEYS}
        )

    def with_absolute_paths(self) -> RunConfig:
        """Return these settings with every file they name (`PATH_KEYS`) made absolute.

        For settings handed to another process that may run in another working directory (a
        Ray worker): there a relative path would name another file, or none.
        """
        paths = {k: os.path.abspath(v) for k in PATH_KEYS if (v := getattr(self, k))}
        return attrs.evolve(self, **paths)


TASKSET_NEEDS_ROUTES: Final = (
    "environment_routing_mode 'taskset' needs environment_server_routes (every row routes by "
    "its taskset); pass +environment_server_routes={<taskset>:<environment server>}"
)

_FIELDS: Final[tuple[attrs.Attribute[Any], ...]] = tuple(attrs.fields(RunConfig))
FIELD_NAMES: Final = frozenset(a.name for a in _FIELDS)
# Settings whose change alters the materialized rows (fingerprinted in the manifest), in the
# order the fingerprint's versions added them.
_PLAN_ROWS: Final = [(row_of(a).plan, index, a.name) for index, a in enumerate(_FIELDS)]
PLAN_KEYS: Final = tuple(key for _, _, key in sorted(r for r in _PLAN_ROWS if r[0] is not None))
# Added to PLAN_KEYS after the first runs were made (hashed only when set; see above).
_LATER_PLAN_KEYS: Final = frozenset(a.name for a in _FIELDS if (row_of(a).plan or 0) > 0)
# Settings that name a file (`RunConfig.with_absolute_paths`).
PATH_KEYS: Final = tuple(a.name for a in _FIELDS if row_of(a).path)
# Keys that order the materialized rows without changing one: a resume dispatches the rows
# saved in the run folder, in their saved order, so a change of these never mixes two runs.
ORDER_KEYS: Final = frozenset(a.name for a in _FIELDS if row_of(a).order)
# NeMo Gym's Optional settings whose null means "the default" where trollout's are required
# (NeMo Gym coerces ``num_repeats: null`` to 1; ``num_samples_in_parallel: null`` is its "no
# limit", trollout's default 64; an empty mapping or list is what null asks for).
NULL_MEANS_DEFAULT: Final = frozenset(a.name for a in _FIELDS if row_of(a).null_default)


def _default_of(field: attrs.Attribute[Any]) -> Any:
    factory = getattr(field.default, "factory", None)
    return factory() if callable(factory) else field.default


_DEFAULTS: Final = {a.name: _default_of(a) for a in _FIELDS if a.name in PLAN_KEYS}
DEFAULTS: Final = _DEFAULTS  # the plan settings' defaults (`saved.plan_differences`)
