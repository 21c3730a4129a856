"""The description of a fake deployment: agents, generation, latency, faults, policy seed.

A spec is loaded from YAML (see fixtures/demo_deployment.yaml) or built in code::

    DeploymentSpec(agents=(AgentSpec("math_agent"),), latency=Latency(fixed_s=0.01))

Every agent gets an agent server, a resources server and (generation "0.7.0") an environment
server fronting it; all agents share one model server that exposes vLLM-style ``/metrics``.

Episode environment servers (docs/protocol.md section 3) come in addition, in any generation: each
answers the materialized task rows of its ``tasksets`` (`DeploymentSpec.routes`, what a run
passes as ``environment_server_routes``) and may bind one of the agents::

    episode_servers:
      - {name: arith_env, tasksets: [arith], agent: math_agent, faults: {...}}

An episode server uses its own latency (else the deployment's) and only its own fault plan: the
deployment-wide plan is written for flat rows.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
import yaml
from attrs import evolve, field, frozen

from ..errors import ConfigError
from .faults import Fault, FaultPlan, plan_from_dict, unit_hash

__all__ = [
    "EPISODE_IMPLEMENTATION",
    "AgentSpec",
    "DeploymentSpec",
    "EpisodeServerSpec",
    "Generation",
    "Latency",
    "load_spec",
    "spec_from_dict",
    "spec_to_dict",
]


class Generation(enum.Enum):
    """Which NeMo Gym generation the fake deployment imitates."""

    V0_7_0 = "0.7.0"  # environment servers front every agent; /run goes to them
    LEGACY = "legacy"  # no environment servers; /run goes to the agent servers


@frozen(kw_only=True)
class Latency:
    """How long each ``/run`` takes before answering.

    The delay of a request is ``fixed_s + jitter_s * u`` with ``u`` in [0, 1) hashed from
    (seed, task, rollout, attempt), so it is different per request yet reproducible.
    """

    fixed_s: float = 0.0
    jitter_s: float = 0.0
    seed: int = 0

    def __attrs_post_init__(self) -> None:
        if self.fixed_s < 0 or self.jitter_s < 0:
            raise ConfigError(
                f"latency must be >= 0 (got fixed_s={self.fixed_s!r}, jitter_s={self.jitter_s!r})"
            )

    def delay_for(self, task: int, rollout: int, attempt: int) -> float:
        """Return the delay in seconds of one request."""
        if not self.jitter_s:
            return self.fixed_s
        return self.fixed_s + self.jitter_s * unit_hash(self.seed, task, rollout, attempt)


@frozen(kw_only=True)
class AgentSpec:
    """One agent of the fake deployment.

    Attributes:
        name: the agent's instance name (``agent_ref.name``).
        accuracy: the chance, before task difficulty, that the policy answers correctly.
        latency: overrides the deployment's latency for this agent.
        faults: overrides the deployment's fault plan for this agent.
        refuse: the servers are listed in the config but their ports are closed.
    """

    name: str
    accuracy: float = 0.7
    latency: Latency | None = None
    faults: FaultPlan | None = None
    refuse: bool = False

    @property
    def environment_server(self) -> str:
        """Return the instance name of the environment server fronting this agent."""
        return f"{self.name}_environment_server"

    @property
    def resources_server(self) -> str:
        """Return the instance name of this agent's resources server."""
        return f"{self.name}_resources"


EPISODE_IMPLEMENTATION = "fake_episode_environment"


@frozen(kw_only=True)
class EpisodeServerSpec:
    """One episode environment server: it answers materialized task rows.

    Attributes:
        name: its instance name (the ``_ng_environment_server`` of its rollouts).
        tasksets: the tasksets routed to it.
        agent: the agent it binds (``agent_server``), or None.
        implementation: its implementation name (the ``_ng_result_type``).
        accuracy: the chance, before task difficulty, that it solves a task.
        latency: overrides the deployment's latency.
        faults: its fault plan (the deployment's plan does not apply).
        refuse: listed in the config, but its port is closed.
    """

    name: str
    tasksets: tuple[str, ...] = field(converter=tuple)
    agent: str | None = None
    implementation: str = EPISODE_IMPLEMENTATION
    accuracy: float = 0.7
    latency: Latency | None = None
    faults: FaultPlan | None = None
    refuse: bool = False

    def __attrs_post_init__(self) -> None:
        if not self.tasksets or not all(isinstance(t, str) and t for t in self.tasksets):
            raise ConfigError(
                f"episode server {self.name!r} needs tasksets, a list of non-empty names "
                f"(got {list(self.tasksets)!r}); add e.g. tasksets: [arith]"
            )


def _episode_servers(value: Iterable[EpisodeServerSpec]) -> tuple[EpisodeServerSpec, ...]:
    return tuple(value)


def _agents(value: Any) -> tuple[AgentSpec, ...]:
    return tuple(AgentSpec(name=a) if isinstance(a, str) else a for a in value)


@frozen(kw_only=True)
class DeploymentSpec:
    """Everything that decides how a fake deployment behaves.

    Attributes:
        agents: the agents, in order (ports are assigned in this order after the head).
        generation: "0.7.0" (environment servers) or "legacy".
        latency: the default latency of ``/run``.
        faults: the default fault plan of ``/run``.
        policy_seed: the seed of every agent's answering policy.
        model_name: the model server's instance name.
        max_running: model-server slots; /run requests beyond this count as waiting in
            ``vllm:num_requests_waiting``.
        record_runs: keep the detailed log of every ``/run`` (benchmarks turn it off).
        episode_servers: episode environment servers, after the agents in port order.
        model_call_capture_dir: the model server captures every call into this dir
            (`capture`: NeMo Gym's capture files; agents reply with a trajectory); None: off.
    """

    agents: tuple[AgentSpec, ...] = field(
        default=(AgentSpec(name="math_agent"), AgentSpec(name="string_agent")),
        converter=_agents,
    )
    generation: Generation = field(default=Generation.V0_7_0, converter=Generation)
    latency: Latency = field(factory=Latency)
    faults: FaultPlan = field(factory=FaultPlan)
    policy_seed: int = 0
    model_name: str = "policy_model"
    max_running: int = 256
    record_runs: bool = True
    episode_servers: tuple[EpisodeServerSpec, ...] = field(default=(), converter=_episode_servers)
    model_call_capture_dir: str | None = None

    def __attrs_post_init__(self) -> None:
        names = [a.name for a in self.agents]
        if not names:
            raise ConfigError("a fake deployment needs at least one agent; add one under 'agents'")
        if len(set(names)) != len(names):
            raise ConfigError(f"agent names must be unique (got {names!r}); rename the duplicates")
        self._check_episode_servers()

    def _check_episode_servers(self) -> None:
        taken = {self.model_name, "head_server"}
        for agent in self.agents:
            taken |= {agent.name, agent.resources_server, agent.environment_server}
        tasksets: set[str] = set()
        for server in self.episode_servers:
            if server.name in taken:
                raise ConfigError(
                    f"episode server name {server.name!r} is already a server's; rename it"
                )
            taken.add(server.name)
            if server.agent is not None:
                self.agent(server.agent)  # raises, naming the known agents
            if tasksets & set(server.tasksets):
                raise ConfigError(
                    f"tasksets {sorted(tasksets & set(server.tasksets))!r} are routed to two "
                    "episode servers; give each taskset one server"
                )
            tasksets |= set(server.tasksets)

    @property
    def routes(self) -> dict[str, str]:
        """Return taskset -> episode server name (a run's ``environment_server_routes``)."""
        return {t: server.name for server in self.episode_servers for t in server.tasksets}

    def agent(self, name: str) -> AgentSpec:
        """Return the agent called ``name``."""
        for agent in self.agents:
            if agent.name == name:
                return agent
        raise ConfigError(
            f"the spec has no agent {name!r}; known: {[a.name for a in self.agents]!r}"
        )

    @classmethod
    def for_benchmark(
        cls,
        agents: Iterable[str],
        *,
        latency_s: float = 0.0,
        generation: Generation | str = Generation.V0_7_0,
    ) -> DeploymentSpec:
        """Return a spec for benchmarks: fixed latency, no faults, no detailed /run log."""
        return cls(
            agents=tuple(AgentSpec(name=a) for a in agents),
            generation=generation,
            latency=Latency(fixed_s=latency_s),
            record_runs=False,
        )

    def with_sleep(self, seconds: float) -> DeploymentSpec:
        """Return this spec where every ``/run`` sleeps ``seconds`` and nothing fails."""
        agents = tuple(evolve(a, latency=None, faults=None) for a in self.agents)
        episodes = tuple(evolve(e, latency=None, faults=None) for e in self.episode_servers)
        return evolve(
            self,
            agents=agents,
            episode_servers=episodes,
            latency=Latency(fixed_s=seconds),
            faults=FaultPlan(),
        )


def _latency(data: Mapping[str, Any] | float | None) -> Latency | None:
    if data is None:
        return None
    if isinstance(data, int | float):
        return Latency(fixed_s=float(data))
    return Latency(**dict(data))


def _agent(data: Mapping[str, Any] | str) -> AgentSpec:
    if isinstance(data, str):
        return AgentSpec(name=data)
    fields = dict(data)
    latency = _latency(fields.pop("latency", None))
    faults = fields.pop("faults", None)
    plan = plan_from_dict(faults) if faults is not None else None
    return AgentSpec(latency=latency, faults=plan, **fields)


def _episode_server(data: Mapping[str, Any]) -> EpisodeServerSpec:
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"episode_servers entries must be mappings (got {data!r}); "
            "write e.g. {name: arith_env, tasksets: [arith]}"
        )
    known = {a.name for a in attrs.fields(EpisodeServerSpec)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"episode server keys {unknown!r} are unknown; known: {sorted(known)!r}")
    fields = dict(data)
    latency = _latency(fields.pop("latency", None))
    faults = fields.pop("faults", None)
    plan = plan_from_dict(faults) if faults is not None else None
    return EpisodeServerSpec(latency=latency, faults=plan, **fields)


_SPEC_KEYS = {
    "agents",
    "generation",
    "latency",
    "faults",
    "policy_seed",
    "model_name",
    "max_running",
    "record_runs",
    "episode_servers",
    "model_call_capture_dir",
}


def spec_from_dict(data: Mapping[str, Any]) -> DeploymentSpec:
    """Build a `DeploymentSpec` from a mapping (the YAML file's shape)."""
    unknown = sorted(set(data) - _SPEC_KEYS)
    if unknown:
        raise ConfigError(
            f"unknown deployment spec keys {unknown!r}; known: {sorted(_SPEC_KEYS)!r}"
        )
    fields = dict(data)
    if "agents" in fields:
        fields["agents"] = tuple(_agent(a) for a in fields["agents"])
    if "episode_servers" in fields:
        fields["episode_servers"] = tuple(_episode_server(e) for e in fields["episode_servers"])
    if "generation" in fields:
        fields["generation"] = str(fields["generation"])
    fields["latency"] = _latency(fields.get("latency")) or Latency()
    fields["faults"] = plan_from_dict(fields.get("faults"))
    try:
        return DeploymentSpec(**fields)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(
            f"invalid deployment spec: {exc}; see fixtures/demo_deployment.yaml"
        ) from exc


def load_spec(path: str | os.PathLike[str]) -> DeploymentSpec:
    """Load a `DeploymentSpec` from a YAML file."""
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"deployment spec {os.fspath(path)!r} must be a YAML mapping (got {data!r})"
        )
    try:
        return spec_from_dict(data)
    except ConfigError as exc:
        raise ConfigError(f"{os.fspath(path)}: {exc}") from exc


def _fault_to_dict(fault: Fault, weight: float) -> dict[str, Any]:
    defaults = Fault(kind=fault.kind)
    data: dict[str, Any] = {"kind": fault.kind.value, "weight": weight}
    for a in attrs.fields(Fault)[1:]:
        value = getattr(fault, a.name)
        if value != getattr(defaults, a.name):
            data[a.name] = list(value) if isinstance(value, tuple) else value
    return data


def _plan_to_dict(plan: FaultPlan) -> dict[str, Any]:
    mix = [_fault_to_dict(fault, weight) for fault, weight in plan.mix]
    return {"seed": plan.seed, "rate": plan.rate, "mix": mix, "max_attempt": plan.max_attempt}


def _agent_to_dict(agent: AgentSpec) -> dict[str, Any]:
    data: dict[str, Any] = {"name": agent.name, "accuracy": agent.accuracy, "refuse": agent.refuse}
    if agent.latency is not None:
        data["latency"] = attrs.asdict(agent.latency)
    if agent.faults is not None:
        data["faults"] = _plan_to_dict(agent.faults)
    return data


def _episode_server_to_dict(server: EpisodeServerSpec) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": server.name,
        "tasksets": list(server.tasksets),
        "agent": server.agent,
        "implementation": server.implementation,
        "accuracy": server.accuracy,
        "refuse": server.refuse,
    }
    if server.latency is not None:
        data["latency"] = attrs.asdict(server.latency)
    if server.faults is not None:
        data["faults"] = _plan_to_dict(server.faults)
    return data


def spec_to_dict(spec: DeploymentSpec) -> dict[str, Any]:
    """Return ``spec`` as a mapping that `spec_from_dict` reads back to an equal spec."""
    return {
        "generation": spec.generation.value,
        "policy_seed": spec.policy_seed,
        "model_name": spec.model_name,
        "max_running": spec.max_running,
        "record_runs": spec.record_runs,
        "latency": attrs.asdict(spec.latency),
        "faults": _plan_to_dict(spec.faults),
        "agents": [_agent_to_dict(a) for a in spec.agents],
        "episode_servers": [_episode_server_to_dict(e) for e in spec.episode_servers],
        "model_call_capture_dir": spec.model_call_capture_dir,
    }
