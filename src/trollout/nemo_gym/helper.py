# Stays whole: one class mirroring NeMo Gym's RolloutCollectionHelper, method for method.
"""`RolloutCollectionHelper` and `BaseServerConfig`: NeMo Gym's direct collection API.

Each method keeps NeMo Gym 0.7.0's signature and returns what it returns (the package
docstring has the design, docs/nemo-gym.md the user's account and every difference). What this
module does itself is small: check the arguments when the call is made, turn them into the
settings of one trollout batch (`_Call`), and convert each `BatchOutcome` into the pair NeMo
Gym's awaitable resolves to.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import attrs
import httpx

from .. import (
    BatchOutcome,
    Deployment,
    Failed,
    Identity,
    Landed,
    OmitReason,
    Omitted,
    RunConfig,
    SeedMode,
    discover,
    outcome_to_row,
    plan_rows,
    shard_rollout_id,
)
from ..aio import AioBatch, open_rollouts
from ..errors import (
    ArgumentTypeError,
    ConfigError,
    InputError,
    RolloutRequestError,
    UnsupportedOptionError,
)
from .completions import RowResultIterator, Settled
from .constants import (
    AGENT_REF_KEY,
    NG_ENVIRONMENT_SERVER_KEY,
    ROLLOUT_INDEX_KEY,
    RUN_ID_KEY,
    TASK_INDEX_KEY,
)

__all__ = ["DEFAULT_HEAD_SERVER", "BaseServerConfig", "RolloutCollectionHelper"]

# Preprocessing without a deployment config routes by agent name only; this URL is never
# contacted (a batch routes through the deployment it discovers when it opens).
_UNCONTACTED = "http://127.0.0.1:9"


@attrs.frozen
class BaseServerConfig:
    """Where a server listens: NeMo Gym's ``BaseServerConfig`` (``host``, ``port``)."""

    host: str
    port: int

    @property
    def url(self) -> str:
        """``http://host:port``."""
        return f"http://{self.host}:{self.port}"


DEFAULT_HEAD_SERVER = BaseServerConfig(host="127.0.0.1", port=11000)
"""The head server a call uses when given none and the helper's config names none."""


class RolloutCollectionHelper:
    """Collect rollouts by sending tasks to a running Gym deployment (NeMo Gym's helper).

    Args:
        reuse_server_client: fetch the deployment's configuration from a head server once and
            reuse it for every later call to the same head (NeMo Gym's meaning); build a new
            helper after that deployment's configuration changes.
        config: trollout's settings for every call (timeouts, retries, concurrency, attempt
            cap, durability...); a call's own arguments override the keys they name. Its
            ``head_server`` or ``agent_urls`` say where calls without ``head_server_config``
            go (default: `DEFAULT_HEAD_SERVER`).

    Raises:
        ArgumentTypeError: ``config`` is not a `RunConfig`.
    """

    def __init__(self, *, reuse_server_client: bool = False, config: RunConfig | None = None):
        if config is not None and not isinstance(config, RunConfig):
            raise ArgumentTypeError(
                f"RolloutCollectionHelper: config must be a trollout.RunConfig (got "
                f"{type(config).__name__}); build one with trollout.RunConfig(...) or "
                "trollout.load_config(options={...})"
            )
        self.reuse_server_client = bool(reuse_server_client)
        self.config = config if config is not None else RunConfig()
        self._deployments: dict[str, Deployment] = {}

    # --- preprocessing ----------------------------------------------------------------------

    def preprocess_examples(
        self,
        examples: list[dict[str, Any]],
        agent_map: dict[str, str] | None = None,
        fan_out: dict[str, list[str]] | None = None,
        num_repeats: int | dict[str, int] = 1,
        num_repeats_add_seed: bool | dict[str, bool] = False,
        global_config_dict: Mapping[str, Any] | None = None,
        task_ids: Sequence[str] | None = None,
    ) -> list[dict[str, Any]]:
        """Apply run-level routing and repetition to rows; return the stamped copies.

        As NeMo Gym's: agents (``agent_map``, ``fan_out``), ``num_repeats`` with NeMo Gym's
        seeds under ``num_repeats_add_seed`` (seed = rollout index), ``task_ids`` keeping
        those tasks once before repetition, task and rollout indices numbered in input order.
        ``global_config_dict`` (the deployment's merged config) also stamps environment
        server routing; without it rows are routed by agent name only. Inputs are not mutated.

        Raises:
            InputError: every problem of the rows and these settings, together.
        """
        if global_config_dict is not None:
            router = Deployment.from_config(global_config_dict)
        else:
            names = _agent_names(examples, agent_map, fan_out, self.config.agent_name)
            if not names:
                raise InputError(
                    [
                        "no row names an agent (agent_ref.name) and no agent_map or fan_out "
                        "gives one; name each row's agent, or pass global_config_dict"
                    ]
                )
            router = Deployment.from_agent_urls(dict.fromkeys(sorted(names), _UNCONTACTED))
        config = attrs.evolve(
            self.config,
            agent_map=dict(agent_map or {}),
            fan_out={k: list(v) for k, v in (fan_out or {}).items()},
            num_repeats=num_repeats,
            num_repeats_add_seed=num_repeats_add_seed,
            seed_mode=SeedMode.ROLLOUT_INDEX,
            task_ids=list(task_ids) if task_ids is not None else None,
            limit=None,
            shard=None,
        )
        return [dict(row.body) for row in plan_rows(examples, config, router).rows()]

    # --- dispatch ---------------------------------------------------------------------------

    def run_examples(
        self,
        examples: list[dict[str, Any]],
        head_server_config: BaseServerConfig | None = None,
        semaphore: asyncio.Semaphore | None = None,
        route_failures_to_sidecar: bool = False,
        environment_server_name: str | None = None,
        max_resident_tasks: int | None = None,
        dispatch_budget_s: float | None = None,
        drain_margin_s: float | None = None,
        latency_tracker: Any = None,
        retry_requests: bool = True,
        enrich_results: bool = False,
        include_model_call_payloads: bool = True,
        delete_model_call_capture: bool = False,
        record_output_dir: Path | str | None = None,
        record_shard: str | None = None,
        record_omitted_rollouts: bool = False,
    ) -> RowResultIterator:
        """Dispatch rows as given; return awaitables of ``(row, result)`` in completion order.

        Nothing starts until the first awaitable is awaited. A row that ran resolves to the
        ``/run`` reply (trollout's identity stamps left on the row, not the result); a failed
        ``/run`` raises `RolloutRequestError` unless ``route_failures_to_sidecar`` (then the
        result is the failure row); a row the dispatch budget never started resolves to
        the drained result (``_ng_failure_class: cancelled``, ``_ng_dispatch_drained``,
        ``_ng_no_persist``). The returned rows are the caller's own, or, enriched (a recorded
        shard always is), the copies dispatched, stamped with the call's run and rollout ids;
        then a routed failure is the typed record (`trollout.Failed`), as ``run_outcomes``
        returns it. Rows never preprocessed (no indices) keep the plain path: the caller's own
        rows and the failure row. docs/nemo-gym.md describes
        every parameter; ``retry_requests`` defaults to True as in NeMo Gym, which may run a
        mutating ``/run`` twice.

        Raises:
            UnsupportedOptionError: ``environment_server_name`` for rows that do not already
                name that server.
            ConfigError: ``record_output_dir`` without ``record_shard`` or the reverse, a bad
                count, or ``delete_model_call_capture`` without the payloads kept.
            ArgumentTypeError: ``examples`` is not a list of JSON objects.
        """
        del latency_tracker
        if (record_output_dir is None) != (record_shard is None):
            raise ConfigError(
                "run_examples: record_output_dir and record_shard go together (the shard "
                "rollouts-<record_shard>.jsonl is written in record_output_dir); pass both"
            )
        rows = _rows_of(examples, "run_examples")
        if environment_server_name is not None:
            _require_environment_server(rows, environment_server_name)
        recorded = record_shard is not None
        enrich = bool(enrich_results) or recorded  # a recorded shard is what collection records
        settings: dict[str, Any] = {
            "retry_requests": bool(retry_requests),
            "record_omitted_rollouts": bool(record_omitted_rollouts),
            "drain_margin_s": drain_margin_s,
            "include_model_call_payloads": bool(include_model_call_payloads),
            "delete_model_call_capture": bool(delete_model_call_capture),
        }
        attrs.evolve(self.config, **settings).validate()  # refused here, before any send
        given = rows
        rows, originals = _numbered(rows)
        # Enriched, the pairs' rows are the copies dispatched (NeMo Gym's page), unless the
        # rows were never preprocessed: those keep the caller's rows, as NeMo Gym's plain path.
        dispatched_rows = recorded or (enrich and rows is given)
        options: dict[str, Any] = {"enrich_results": enrich}
        if recorded:
            options |= {"record_shard": record_shard, "record_output_dir": record_output_dir}
        call = _Call(
            self,
            rows,
            head_server_config,
            settings=settings,
            parallel=_parallel(semaphore, max_resident_tasks),
            budget_s=dispatch_budget_s,
            batch_options=options,
        )

        def pair_row(item_row: dict[str, Any]) -> dict[str, Any]:
            if dispatched_rows:
                return item_row
            return originals[(item_row[TASK_INDEX_KEY], item_row[ROLLOUT_INDEX_KEY])]

        def convert(item: BatchOutcome) -> Settled:
            row, outcome = pair_row(item.row), item.outcome
            if type(outcome) is Landed:
                return Settled((row, dict(outcome.result)))
            if type(outcome) is Failed:
                failure = outcome_to_row(outcome)
                if route_failures_to_sidecar:  # enriched: the typed record, as run_outcomes'
                    return Settled((row, outcome if dispatched_rows else failure))
                return Settled(error=RolloutRequestError(item.row, failure))
            assert type(outcome) is Omitted
            if outcome.reason is OmitReason.DRAINED:
                return Settled((row, outcome_to_row(outcome)))
            return Settled(error=asyncio.CancelledError("the rollout was interrupted"))

        def never_started(seen: set[tuple[int, int]], run_id: str) -> list[Settled]:
            return [
                Settled(
                    (_stamped(row, run_id) if dispatched_rows else pair_row(row), _drained(row))
                )
                for row in rows
                if (row[TASK_INDEX_KEY], row[ROLLOUT_INDEX_KEY]) not in seen
            ]

        return RowResultIterator(len(rows), call.open, convert, never_started)

    def run_outcomes(
        self,
        examples: list[dict[str, Any]],
        head_server_config: BaseServerConfig | None = None,
        semaphore: asyncio.Semaphore | None = None,
        run_id: str | None = None,
    ) -> RowResultIterator:
        """Yield ``(row, completed dict | typed record)`` in completion order.

        Expected failures come back as trollout's typed records (`trollout.Failed`; an
        interrupted or drained rollout as `trollout.Omitted`), never raised. Rows are copies
        stamped with the call's run (``run_id``, else the run id every row already carries,
        else a new one). Nothing is persisted; nothing is retried beyond the helper config's
        retry policy.

        Raises:
            ArgumentTypeError: ``examples`` is not a list of JSON objects.
        """
        rows = _rows_of(examples, "run_outcomes")
        if run_id is None:
            stamps = {row.get(RUN_ID_KEY) for row in rows}
            only = stamps.pop() if len(stamps) == 1 else None
            run_id = only if isinstance(only, str) and only else None
        rows, _ = _numbered(rows)
        call = _Call(
            self,
            rows,
            head_server_config,
            settings={},
            parallel=_parallel(semaphore, None),
            budget_s=None,
            batch_options={"run_id": run_id},
        )

        def convert(item: BatchOutcome) -> Settled:
            outcome = item.outcome
            if type(outcome) is Landed:
                return Settled((item.row, dict(outcome.result)))
            return Settled((item.row, outcome))

        def never_started(seen: set[tuple[int, int]], run_id: str) -> list[Settled]:
            return [
                Settled((_stamped(row, run_id), _omitted(row)))
                for row in rows
                if (row[TASK_INDEX_KEY], row[ROLLOUT_INDEX_KEY]) not in seen
            ]

        return RowResultIterator(len(rows), call.open, convert, never_started)

    # --- the deployment ---------------------------------------------------------------------

    async def deployment(self, head_server_config: BaseServerConfig | None = None) -> Deployment:
        """Return the deployment a call goes to (discovered once per head with
        ``reuse_server_client``).

        Raises:
            DeploymentError: the head server cannot be reached or serves a bad config.
            ConfigError: a bad URL.
        """
        config = self.config
        if head_server_config is None and config.head_server is None and config.agent_urls:
            return Deployment.from_agent_urls(config.agent_urls)
        if head_server_config is not None:
            url = head_server_config.url
        else:
            url = config.head_server or DEFAULT_HEAD_SERVER.url
        cached = self._deployments.get(url) if self.reuse_server_client else None
        if cached is not None:
            return cached
        timeout = httpx.Timeout(config.read_timeout_s, connect=config.connect_timeout_s)
        async with httpx.AsyncClient(timeout=timeout, trust_env=False) as client:
            found = await discover(client, url, env_allow=config.served_config_env_allow)
        if self.reuse_server_client:
            self._deployments[url] = found
        return found


@attrs.define
class _Call:
    """One call's batch: where it goes, its settings, and how to open it (first await)."""

    helper: RolloutCollectionHelper
    rows: list[dict[str, Any]]
    head: BaseServerConfig | None
    settings: dict[str, Any]
    parallel: int | None
    budget_s: float | None
    batch_options: dict[str, Any]
    called_at: float = attrs.field(factory=time.monotonic)

    async def open(self, stack: AsyncExitStack) -> AioBatch:
        """Open the session: discover, open the front end and the batch (on ``stack``)."""
        deployment = await self.helper.deployment(self.head)
        settings = dict(self.settings)
        if self.parallel is not None:
            settings["num_samples_in_parallel"] = self.parallel
        if self.budget_s is not None:  # counted from the call, as NeMo Gym's
            settings["dispatch_budget_s"] = max(0.0, self.budget_s - self._elapsed())
        config = attrs.evolve(self.helper.config, **settings)
        folder = self.batch_options.get("record_output_dir")
        options = {k: v for k, v in self.batch_options.items() if k != "record_output_dir"}
        rollouts = await stack.enter_async_context(
            open_rollouts(deployment, config=config, record_output_dir=folder)
        )
        return await stack.enter_async_context(rollouts.open_batch(self.rows, **options))

    def _elapsed(self) -> float:
        return time.monotonic() - self.called_at


def _rows_of(examples: Any, method: str) -> list[dict[str, Any]]:
    if not isinstance(examples, list | tuple) or not all(isinstance(r, dict) for r in examples):
        raise ArgumentTypeError(
            f"{method}: examples must be a list of row dicts (got {type(examples).__name__}); "
            "pass the rows preprocess_examples returned"
        )
    return list(examples)


def _numbered(
    rows: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], dict[tuple[Any, Any], dict[str, Any]]]:
    """Return the rows to dispatch and the caller's row per (task, rollout).

    Rows that were never preprocessed (no row carries task and rollout indices) are numbered
    on copies, task = position, rollout 0, which trollout's batches need to key each rollout;
    NeMo Gym sends such rows as they are. Anything else is dispatched as given (a batch
    refuses a row without indices, or one repeating another's, with an `InputError`).
    """
    if rows and not any(TASK_INDEX_KEY in r or ROLLOUT_INDEX_KEY in r for r in rows):
        numbered = [{**row, TASK_INDEX_KEY: i, ROLLOUT_INDEX_KEY: 0} for i, row in enumerate(rows)]
        return numbered, {(i, 0): row for i, row in enumerate(rows)}
    originals = {(r.get(TASK_INDEX_KEY), r.get(ROLLOUT_INDEX_KEY)): r for r in rows}
    return rows, originals


def _parallel(semaphore: asyncio.Semaphore | None, max_resident_tasks: int | None) -> int | None:
    """This call's rollouts in flight: the fewest of the semaphore's free permits (at the
    call) and ``max_resident_tasks``; None leaves the helper config's."""
    caps = []
    if max_resident_tasks is not None:
        if isinstance(max_resident_tasks, bool) or not isinstance(max_resident_tasks, int):
            raise ConfigError(f"max_resident_tasks must be an int (got {max_resident_tasks!r})")
        if max_resident_tasks < 1:
            raise ConfigError(f"max_resident_tasks must be >= 1 (got {max_resident_tasks})")
        caps.append(max_resident_tasks)
    if semaphore is not None:
        value = getattr(semaphore, "_value", None)
        if isinstance(value, int):
            caps.append(max(1, value))
    return min(caps) if caps else None


def _require_environment_server(rows: list[dict[str, Any]], name: str) -> None:
    other = [i for i, r in enumerate(rows) if r.get(NG_ENVIRONMENT_SERVER_KEY) != name]
    if other:
        raise UnsupportedOptionError(
            f"run_examples(environment_server_name={name!r}): rows[{other[0]}] (and "
            f"{len(other) - 1} more) are not routed to it; trollout routes rows when it plans "
            "them: set RunConfig(environment_server_name=...) on the helper and call "
            "preprocess_examples with global_config_dict"
        )


def _agent_names(
    rows: Any,
    agent_map: Mapping[str, str] | None,
    fan_out: Mapping[str, Sequence[str]] | None,
    agent_name: str | None,
) -> set[str]:
    names = set((agent_map or {}).values()) | set((agent_map or {}).keys())
    for agents in (fan_out or {}).values():
        names.update(agents)
    names.update((fan_out or {}).keys())
    if agent_name:
        names.add(agent_name)
    for row in rows if isinstance(rows, list | tuple) else ():
        ref = row.get(AGENT_REF_KEY) if isinstance(row, dict) else None
        if isinstance(ref, dict) and isinstance(ref.get("name"), str) and ref["name"]:
            names.add(ref["name"])
    return names


def _stamped(row: dict[str, Any], run_id: str) -> dict[str, Any]:
    """The copy of ``row`` a batch of run ``run_id`` dispatches (for rows it never started)."""
    return {**row, "_ng_rollout_id": shard_rollout_id(row, run_id), RUN_ID_KEY: run_id}


def _omitted(row: dict[str, Any]) -> Omitted:
    return Omitted(Identity.from_row(row), 0, OmitReason.DRAINED)


def _drained(row: dict[str, Any]) -> dict[str, Any]:
    """NeMo Gym's result for a row the dispatch budget never started."""
    return outcome_to_row(_omitted(row))
