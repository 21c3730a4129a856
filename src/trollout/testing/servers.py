"""The fake deployment's servers: what each answers on which path.

One `FakeServer` per instance (head, agent, environment, resources, model); all share one
`DeploymentState` (spec, stats, config text, fault callable). Endpoints, as NeMo Gym's:

=================  ======================================  ================================
every server       ``GET /``                               ``{"status": "ok"}``
head               ``GET /global_config_dict_yaml``        the config, YAML inside a JSON string
head (ours)        ``GET /_fake/stats``, ``/_fake/runs``   counters; the detailed /run log
head (ours)        ``GET /_fake/requests``                 the log as objects, with run ids
agent, environment ``POST /run``, ``POST /aggregate_metrics``
episode env.       ``POST /run`` (episode requests only)   `episodes`; ``/aggregate_metrics``
resources          ``POST /aggregate_metrics``
model              ``GET /metrics``                        vLLM gauges (Prometheus text)
=================  ======================================  ================================

A handler that raises answers 500 with a JSON string body, as Gym servers do; 422 bodies are
shaped like FastAPI's.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any

import attrs
import orjson
import trio
from attrs import define

from ..errors import ConfigError
from ..httpserver import Action, Reply, Request
from .aggregate import aggregate_metrics
from .capture import capture_rollout
from .episodes import episode_key, episode_reply, parse_episode, run_id_of
from .fault_replies import fault_reply
from .faults import (
    EPISODE_KINDS,
    FAULT_FIELD,
    Fault,
    FaultContext,
    FaultFn,
    FaultKind,
    FaultPlan,
    row_fault,
)
from .policy import MODEL_ID, answer_row, answer_task, build_response
from .spec import AgentSpec, DeploymentSpec, EpisodeServerSpec, Latency
from .stats import FakeStats

__all__ = ["DeploymentState", "FakeServer", "Role"]

_OK = orjson.dumps({"status": "ok"})


class Role(enum.Enum):
    """What a fake server instance is."""

    HEAD = "head_server"
    AGENT = "responses_api_agents"
    ENVIRONMENT = "environment_servers"
    RESOURCES = "resources_servers"
    MODEL = "responses_api_models"


@define
class DeploymentState:
    """What every server of one fake deployment shares (mutable on purpose: tests tweak it)."""

    spec: DeploymentSpec
    stats: FakeStats
    config_yaml: str = ""
    fault_fn: FaultFn | None = None
    # Requests seen per (run id, task, rollout, attempt): the next one's index in its attempt.
    # Counted only while something reads it (a fault hook, a row's own fault).
    request_counts: dict[tuple[str | None, int, int, int], int] = attrs.field(factory=dict)

    def next_request_index(self, run_id: str | None, key: tuple[int, int, int]) -> int:
        """Count one request of ``key`` and return its index within its attempt."""
        full = (run_id, *key)
        index = self.request_counts.get(full, 0)
        self.request_counts[full] = index + 1
        return index


def _detail(kind: str, loc: list[Any], msg: str, value: Any) -> Reply:
    body = {"detail": [{"type": kind, "loc": loc, "msg": msg, "input": value}]}
    return Reply(status=422, body=orjson.dumps(body))


def parse_object(body: bytes, required: str) -> dict[str, Any] | Reply:
    """Return the JSON object in ``body``, or the 422 reply FastAPI would give."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        err = {"type": "json_invalid", "loc": ["body", 0], "msg": "JSON decode error", "input": {}}
        return Reply(
            status=422, body=orjson.dumps({"detail": [err | {"ctx": {"error": str(exc)}}]})
        )
    msg = "Input should be a valid dictionary or object to extract fields from"
    if not isinstance(data, dict):
        return _detail("model_attributes_type", ["body"], msg, data)
    if required not in data:
        return _detail("missing", ["body", required], "Field required", data)
    return data


def _index(row: Mapping[str, Any], key: str) -> int:
    value = row.get(key, 0)
    return value if isinstance(value, int) else 0


class FakeServer:
    """One fake server instance; `handle` is its HTTP handler.

    An agent or legacy environment server is built with its `AgentSpec`; an episode
    environment server with its `EpisodeServerSpec` (`spec` is either).
    """

    def __init__(
        self,
        name: str,
        role: Role,
        state: DeploymentState,
        spec: AgentSpec | EpisodeServerSpec | None = None,
    ) -> None:
        self.name = name
        self.role = role
        self.state = state
        self.agent = spec if isinstance(spec, AgentSpec) else None
        self.episode = spec if isinstance(spec, EpisodeServerSpec) else None
        self._routes = self._route_table()

    @property
    def _agent(self) -> AgentSpec:
        # Only agent and environment servers route /run, and both are built with an agent.
        assert self.agent is not None
        return self.agent

    def _route_table(self) -> dict[tuple[str, str], Callable[[Request], Awaitable[Reply]]]:
        routes: dict[tuple[str, str], Callable[[Request], Awaitable[Reply]]] = {
            ("GET", "/"): self._ok
        }
        if self.role is Role.HEAD:
            routes[("GET", "/global_config_dict_yaml")] = self._config
            routes[("GET", "/_fake/stats")] = self._stats
            routes[("GET", "/_fake/runs")] = self._runs
            routes[("GET", "/_fake/requests")] = self._requests
        if self.role in (Role.AGENT, Role.ENVIRONMENT):
            routes[("POST", "/run")] = self._run
        if self.role in (Role.AGENT, Role.ENVIRONMENT, Role.RESOURCES):
            routes[("POST", "/aggregate_metrics")] = self._aggregate
        if self.role is Role.MODEL:
            routes[("GET", "/metrics")] = self._metrics
        return routes

    async def handle(self, request: Request) -> Reply:
        """Answer one request (never raises except for cancellation).

        Cancellation:
            A checkpoint only where the endpoint waits (``/run`` latency); a cancelled
            ``/run`` is no longer counted in flight. Nothing else is left behind.
        """
        stats = self.state.stats
        stats.by_path[request.path] += 1
        reply = await self._dispatch(request)
        if reply.action is Action.SEND:
            stats.by_status[reply.status] += 1
        return reply

    async def _dispatch(self, request: Request) -> Reply:
        route = self._routes.get((request.method, request.path))
        if route is None:
            known = any(path == request.path for _, path in self._routes)
            status, detail = (405, "Method Not Allowed") if known else (404, "Not Found")
            return Reply(status=status, body=orjson.dumps({"detail": detail}))
        try:
            return await route(request)
        except Exception as exc:
            role = self.role.name.title()
            message = f"Hit an exception in Fake{role}___{self.name}: {type(exc).__name__}: {exc}"
            return Reply(status=500, body=orjson.dumps(message))

    async def _ok(self, request: Request) -> Reply:
        return Reply(body=_OK)

    async def _config(self, request: Request) -> Reply:
        return Reply(body=orjson.dumps(self.state.config_yaml))

    async def _stats(self, request: Request) -> Reply:
        return Reply(body=orjson.dumps(self.state.stats.to_json()))

    async def _runs(self, request: Request) -> Reply:
        runs = [
            [s.server, s.agent, s.task_index, s.rollout_index, s.attempt_index, s.fault]
            for s in self.state.stats.runs
        ]
        return Reply(body=orjson.dumps(runs))

    async def _requests(self, request: Request) -> Reply:
        return Reply(body=orjson.dumps([s.to_json() for s in self.state.stats.runs]))

    async def _metrics(self, request: Request) -> Reply:
        return Reply(body=vllm_metrics(self.state), content_type="text/plain; version=0.0.4")

    async def _aggregate(self, request: Request) -> Reply:
        data = parse_object(request.body, "verify_responses")
        if isinstance(data, Reply):
            return data
        rows = data["verify_responses"]
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            return _detail(
                "list_type", ["body", "verify_responses"], "Input should be a valid list", rows
            )
        return Reply(body=orjson.dumps(aggregate_metrics(rows)))

    async def _run(self, request: Request) -> Reply:
        if self.episode is not None:
            return await self._run_episode(request, self.episode)
        # A flat row needs its responses_create_params object.
        row = parse_object(request.body, "responses_create_params")
        if isinstance(row, Reply):
            return row
        if not isinstance(row["responses_create_params"], dict):
            msg = "Input should be a valid dictionary or object to extract fields from"
            loc = ["body", "responses_create_params"]
            return _detail("model_attributes_type", loc, msg, row["responses_create_params"])
        key = (
            _index(row, "_ng_task_index"),
            _index(row, "_ng_rollout_index"),
            _index(row, "_ng_attempt_index"),
        )
        agent = self._agent
        plan = agent.faults or self.state.spec.faults
        fault = self._fault_for(row, row, key, agent.name, plan)
        kind = None if fault is None else fault.kind.value
        trace = request.headers.get("traceparent")
        run_id = run_id_of(row)
        self.state.stats.run_seen(
            self.name, agent.name, key, kind, traceparent=trace, run_id=run_id
        )
        latency = agent.latency or self.state.spec.latency
        return await self._run_in_flight(key, fault, latency, partial(self._flat_reply, row))

    async def _run_episode(self, request: Request, episode: EpisodeServerSpec) -> Reply:
        data = parse_object(request.body, "episode_id")
        if isinstance(data, Reply):
            return data
        refused = parse_episode(data)
        if refused is not None:
            return refused
        key = episode_key(data)
        plan = episode.faults or FaultPlan()
        fault = self._fault_for(data["task"]["task_input"], data, key, episode.agent, plan)
        kind = None if fault is None else fault.kind.value
        trace = request.headers.get("traceparent")
        run_id = run_id_of(data)
        stats = self.state.stats
        stats.run_seen(self.name, episode.agent, key, kind, traceparent=trace, run_id=run_id)
        latency = episode.latency or self.state.spec.latency
        answer = partial(self._episode_reply, data, episode, key[1])
        return await self._run_in_flight(key, fault, latency, answer)

    def _fault_for(
        self,
        carrier: Any,
        request: dict[str, Any],
        key: tuple[int, int, int],
        agent: str | None,
        plan: FaultPlan,
    ) -> Fault | None:
        """Return a request's fault: its `carrier`'s ``fake_fault``, the hook's, the plan's."""
        own = isinstance(carrier, dict) and FAULT_FIELD in carrier
        fault, hook = None, self.state.fault_fn
        if own or hook is not None:
            run_id = run_id_of(request)
            index = self.state.next_request_index(run_id, key)
            fault = row_fault(carrier, key[2], index) if own else None
            if fault is None and hook is not None:
                fault = hook(FaultContext(self.name, agent, *key, request, index, run_id))
        if fault is None:
            fault = plan.fault_for(*key)
        return fault

    async def _run_in_flight(
        self,
        key: tuple[int, int, int],
        fault: Fault | None,
        latency: Latency,
        reply: Callable[[Fault | None], Reply],
    ) -> Reply:
        stats = self.state.stats
        stats.run_started(self.name)
        done = partial(stats.run_ended, self.name)
        try:
            delay = latency.delay_for(*key)
            delay += fault.delay_s if fault is not None else 0.0
            if delay > 0:
                await trio.sleep(delay)
            return attrs.evolve(reply(fault), on_done=done)
        except BaseException:
            done()
            raise

    def _flat_reply(self, row: dict[str, Any], fault: Fault | None) -> Reply:
        if fault is None or fault.kind is FaultKind.LATENCY:
            return Reply(body=orjson.dumps(self._result(row)))
        if fault.kind in EPISODE_KINDS:
            raise ConfigError(
                f"fault kind {fault.kind.value!r} is for episode servers; a flat row's server "
                "cannot apply it"
            )
        return fault_reply(fault, row, self._result)

    def _episode_reply(
        self, data: dict[str, Any], episode: EpisodeServerSpec, seed: int, fault: Fault | None
    ) -> Reply:
        def answer(request: dict[str, Any]) -> dict[str, Any]:
            task_input = request["task"]["task_input"]
            return answer_task(
                task_input,
                server=self.name,
                accuracy=episode.accuracy,
                policy_seed=self.state.spec.policy_seed,
                seed=seed,
            )

        if fault is None or fault.kind is FaultKind.LATENCY or fault.kind not in _TRANSPORT:
            return Reply(body=orjson.dumps(episode_reply(data, answer, fault)))
        return fault_reply(fault, data, partial(episode_reply, answer=answer, fault=None))

    def _result(self, row: dict[str, Any]) -> dict[str, Any]:
        """Return the success reply to ``row`` as a mapping."""
        agent, spec = self._agent, self.state.spec
        answer = answer_row(
            row, agent=agent.name, accuracy=agent.accuracy, policy_seed=spec.policy_seed
        )
        response = build_response(row, answer, model=MODEL_ID)
        traced: dict[str, Any] = {}
        if spec.model_call_capture_dir is not None:  # the model server captures its calls
            trajectory = capture_rollout(
                spec.model_call_capture_dir, row, response, spec.model_name
            )
            traced = {"ng_trajectory": trajectory}
        if self.role is Role.AGENT:
            return {**row, "response": response, "reward": answer.reward, **traced}
        return {
            "responses_create_params": row["responses_create_params"],
            "response": response,
            "reward": answer.reward,
            "mask_sample": False,
            "failure_kind": None,
            "failure_reason": None,
            **traced,
        }


# The kinds any server carries out the same way, whatever the request (statuses, broken streams).
_TRANSPORT = frozenset(
    {
        FaultKind.STATUS,
        FaultKind.OVERSIZED,
        FaultKind.SLOWLORIS,
        FaultKind.UNSOLICITED_REPLY,
        FaultKind.RESET_MID_REQUEST,
        FaultKind.DISCONNECT,
        FaultKind.RESET_MID_RESPONSE,
        FaultKind.HANG,
        FaultKind.NOT_JSON,
        FaultKind.NOT_OBJECT,
    }
)


def vllm_metrics(state: DeploymentState) -> bytes:
    """Return vLLM-style Prometheus gauges derived from the ``/run`` requests in flight."""
    spec, busy = state.spec, state.stats.in_flight
    running, waiting = min(busy, spec.max_running), max(busy - spec.max_running, 0)
    label = f'{{model_name="{MODEL_ID}"}}'
    lines = [
        "# HELP vllm:num_requests_running Number of requests currently running on GPU.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{label} {float(running)}",
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{label} {float(waiting)}",
    ]
    return ("\n".join(lines) + "\n").encode()
