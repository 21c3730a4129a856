"""Materializing one rollout of a row: stale keys out, overrides in, seed, identity stamps.

Prompt (``prompt_config``, `prompts`): a template builds ``responses_create_params.input``
first, from the row as given, held to the input line limit; everything below applies to the row
it built.

Seeds (docs/protocol.md section 5, item 6). With ``num_repeats_add_seed`` (true, or per agent:
``{agent: true, _default: false}``, the dispatched agent's entry else ``_default``), each rollout's
``responses_create_params.metadata.extra_body`` becomes a JSON *string* holding ``seed``; an
existing extra_body (an object, or a string holding one) is kept and extended, its ``seed``
replaced. The seed is, by `config.SeedMode`:

- ``rollout-index`` (default): the rollout index, NeMo Gym's values (every task gets seeds 0,
  1, ...), so the same eval on the same deterministic policy reproduces NeMo Gym's.
- ``hash`` (opt-in): `rollout_seed`, exactly::

      data = f"trollout-seed:{run_seed}:{task}:{rollout}".encode()   # decimal integers
      int.from_bytes(hashlib.sha256(data).digest()[:8], "big") % 2**31

  deterministic on every machine and Python version (never the salted ``hash()``), and
  different across tasks.

The mode is part of a run's identity: the seeds are written into the materialized inputs, and
the manifest records the mode. A run saved before the default changed (its manifest holds
``hash``, or no ``seed_mode`` at all) resumes in hash mode (`settings.saved_as_started`); a
resume that asks for another mode of a seeded run is refused as a changed setting. Rejected:
keeping hash as the default and documenting the difference: a NeMo Gym user switching over
got other seeds without asking, and an eval did not reproduce.

Run-level ``responses_create_params`` overrides are shallow-merged over the row's (the override
wins per top-level key, so an override's ``metadata`` replaces the row's); the seed is added after
the merge. Rows without ``responses_create_params`` (0.7.0 task rows) get neither.

Stamps: ``_ng_task_index``, ``_ng_rollout_index``, ``agent_ref`` (extra fields such as ``type``
kept when the agent is the row's own), and when the route has them ``_ng_environment_server`` and
``_ng_result_type``. The body carries everything the rollout's `Identity` holds: the identity
is read from it (`MaterializedRow.from_body`), by a plan's ``rows()`` as by resume and the CLI
from the materialized-inputs file, so there is one rule for both. A task
row's ``task_id`` and its ``task_data`` provenance keys (``_ng_digest``, ``_ng_dataset_digest``)
are dataset fields already on the body; the `Identity` reads them from there, and every record
of the rollout carries them (``_ng_task_id`` and the provenance keys at the top level).

Stale collector keys: every ``_ng_*`` key of an input row is dropped except ``_ng_task_index``,
``_ng_rollout_id`` (docs/protocol.md section 2) and ``_ng_run_id`` (it names the run prefix of a
returned row's rollout id, which a driver's next batch replaces rather than nests), so an
earlier run's failure sentinels, attempt numbers or ``_ng_no_persist`` never reach a server.
Top-level ``reward`` and ``response`` are dataset fields like any other and are kept, *except*
on a row that carries ``_ng_rollout_index``: only a collector writes that key, so such a row
was built from an earlier run's output, and its ``reward`` and ``response`` are that run's
results; an agent that echoes request fields would otherwise hand the stale reward back as if
it were a fresh score.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final, NamedTuple

import orjson

from ...errors import InputError
from ...records import COLLECTOR_KEY_PREFIX, is_mapping
from ...settings import RunConfig, SeedMode
from .prompts import load_prompt
from .routing import Copy

__all__ = ["Materializer", "Prepared", "rollout_seed", "strip_stale_keys"]

TASK_INDEX: Final = "_ng_task_index"
ROLLOUT_INDEX: Final = "_ng_rollout_index"
ROLLOUT_ID: Final = "_ng_rollout_id"
RUN_ID: Final = "_ng_run_id"
ENVIRONMENT_SERVER: Final = "_ng_environment_server"
RESULT_TYPE: Final = "_ng_result_type"
PARAMS: Final = "responses_create_params"
_KEPT_COLLECTOR_KEYS: Final = frozenset({TASK_INDEX, ROLLOUT_ID, RUN_ID})
_STALE_RESULT_KEYS: Final = frozenset({"reward", "response"})
_SEED_MODULUS: Final = 2**31
_MAX_SHOWN: Final = 80

Row = dict[str, Any]


def rollout_seed(run_seed: int, task: int, rollout: int) -> int:
    """Return the hash-mode seed of a rollout, in ``[0, 2**31)`` (formula in the module doc)."""
    data = f"trollout-seed:{run_seed}:{task}:{rollout}".encode()
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big") % _SEED_MODULUS


def strip_stale_keys(row: Mapping[str, Any]) -> Row:
    """Return a copy of an input row without stale collector keys (see the module doc)."""
    from_output = ROLLOUT_INDEX in row
    return {
        key: value
        for key, value in row.items()
        if not (key.startswith(COLLECTOR_KEY_PREFIX) and key not in _KEPT_COLLECTOR_KEYS)
        and not (from_output and key in _STALE_RESULT_KEYS)
    }


class Prepared(NamedTuple):
    """One input row ready to be copied into rollouts (done once per row, not per rollout)."""

    body: Row  # stale keys stripped, overrides merged; no stamps yet
    params: Row | None  # the merged responses_create_params, if the row has them
    extra: Row | None  # the parsed extra_body, when seeding
    agent_ref: Mapping[str, Any] | None


class Materializer:
    """Turn prepared rows into materialized bodies (seeds, stamps)."""

    def __init__(self, config: RunConfig) -> None:
        self._overrides = config.responses_create_params
        self._add_seed = config.num_repeats_add_seed  # a bool, or {agent: bool, _default: bool}
        self._any_seed = _any_true(self._add_seed)
        self._run_seed = config.seed
        self._by_index = config.seed_mode is SeedMode.ROLLOUT_INDEX
        self._prompt = load_prompt(config.prompt_config) if config.prompt_config else None
        self._max_bytes = config.max_input_line_bytes  # an expanded row's limit (`prompts`)

    def prompted(
        self, row: Mapping[str, Any], row_bytes: int
    ) -> tuple[Mapping[str, Any], int, str | None]:
        """Return the row as ``prompt_config`` builds it and its size, or why it cannot be built.

        ``row_bytes``: the row's size as read; it is the size returned when there is no prompt.
        """
        if self._prompt is None:
            return row, row_bytes, None
        problem = self._prompt.check(row)
        if problem:
            return row, row_bytes, problem
        built = self._prompt.expand(row, row_bytes=row_bytes, max_bytes=self._max_bytes)
        return (built.row if built.row is not None else row), built.size, built.problem

    def expanded_bytes(self, row: Mapping[str, Any], row_bytes: int) -> int:
        """Return a checked row's size once ``prompt_config`` expands it (counted, not built)."""
        if self._prompt is None:
            return row_bytes
        measure = self._prompt.expand
        return measure(row, row_bytes=row_bytes, max_bytes=self._max_bytes, keep=False).size

    def check(self, row: Mapping[str, Any]) -> str | None:
        """Return why seeds cannot be added to a (prompted) row, or None."""
        params = self._params(row)
        if not self._any_seed or params is None:
            return None
        return _extra_body(params)[1]

    def prepare(self, row: Mapping[str, Any]) -> Prepared:
        """Build the prompt, strip stale keys, merge overrides, parse extra_body, once per row."""
        body = strip_stale_keys(self._prompted(row) if self._prompt is not None else row)
        params = self._params(body)
        if params is not None:
            body[PARAMS] = params
        extra = _extra_body(params)[0] if self._any_seed and params is not None else None
        ref = body.get("agent_ref")
        return Prepared(body, params, extra, ref if is_mapping(ref) else None)

    def make(self, prepared: Prepared, task: int, rollout: int, copy: Copy) -> Row:
        """Return the body of rollout ``rollout`` of task ``task``, run by ``copy``'s agent.

        Its identity is read from it (`MaterializedRow.from_body`), as from the file.
        """
        body = dict(prepared.body)
        if prepared.params is not None and prepared.extra is not None and self.seeds(copy.agent):
            body[PARAMS] = self._seeded(prepared.params, prepared.extra, task, rollout)
        if copy.agent is None:
            body.pop("agent_ref", None)  # a task row names no agent
        else:
            ref = prepared.agent_ref
            same = ref is not None and ref.get("name") == copy.agent
            body["agent_ref"] = dict(ref) if same and ref is not None else {"name": copy.agent}
        body[TASK_INDEX] = task
        body[ROLLOUT_INDEX] = rollout
        if copy.environment_server is not None:
            body[ENVIRONMENT_SERVER] = copy.environment_server
        if copy.result_type is not None:
            body[RESULT_TYPE] = copy.result_type
        return body

    def _prompted(self, row: Mapping[str, Any]) -> Mapping[str, Any]:
        """Build a planned row's prompt (planning accepted it; held to the limit all the same)."""
        assert self._prompt is not None
        built = self._prompt.expand(row, row_bytes=0, max_bytes=self._max_bytes)
        if built.row is None:
            raise InputError([str(built.problem)])
        return built.row

    def seeds(self, agent: str | None) -> bool:
        """Return whether an agent's rollouts get seeds (``num_repeats_add_seed`` per agent)."""
        setting = self._add_seed
        if isinstance(setting, bool):
            return setting
        if agent is not None and agent in setting:
            return setting[agent]
        return setting.get("_default", False)

    def seed_for(self, task: int, rollout: int) -> int:
        """Return the seed of one rollout under this run's seed mode."""
        return rollout if self._by_index else rollout_seed(self._run_seed, task, rollout)

    def _params(self, row: Mapping[str, Any]) -> Row | None:
        params = row.get(PARAMS)
        if not isinstance(params, dict):
            return None
        return {**params, **self._overrides} if self._overrides else params

    def _seeded(self, params: Row, extra: Row, task: int, rollout: int) -> Row:
        metadata = dict(params.get("metadata") or {})
        seeded = {**extra, "seed": self.seed_for(task, rollout)}
        metadata["extra_body"] = json.dumps(seeded, default=_as_orjson_encodes)
        return {**params, "metadata": metadata}


def _as_orjson_encodes(value: object) -> Any:
    """Encode what stdlib json cannot as orjson, which checked the row in planning, does.

    An in-memory row (`plan_rows`) may hold a ``datetime.date``, a UUID or a dataclass: planning
    accepts them, and the materialized row holds them as orjson writes them (a date as ISO
    text), so its seeded extra_body must hold the same, not fail while rows are materialized.
    """
    return orjson.loads(orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS))


def _any_true(setting: bool | Mapping[str, bool]) -> bool:
    return setting if isinstance(setting, bool) else any(setting.values())


def _extra_body(params: Mapping[str, Any]) -> tuple[Row, str | None]:
    """Return the row's extra_body as an object, or a problem saying why it is not one."""
    metadata = params.get("metadata")
    if metadata is None:
        return {}, None
    if not isinstance(metadata, dict):
        return {}, _seed_problem("metadata", metadata)
    extra = metadata.get("extra_body")
    if extra is None or (isinstance(extra, str) and not extra.strip()):
        return {}, None
    if isinstance(extra, dict):
        return extra, None
    if isinstance(extra, str):
        try:
            parsed = json.loads(extra)
        except json.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict):
            return parsed, None
    return {}, _seed_problem("metadata.extra_body", extra)


def _seed_problem(key: str, value: Any) -> str:
    shown = repr(value)
    shown = shown if len(shown) <= _MAX_SHOWN else shown[: _MAX_SHOWN - 1] + "…"
    return (
        f"{PARAMS}.{key} must be an object (extra_body: or a string holding a JSON object) to "
        f"add the seed (got {shown}); fix it, or turn num_repeats_add_seed off"
    )
