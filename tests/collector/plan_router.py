"""A tiny table-driven `Router` for the plan tests (the real one is `deployment.Deployment`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from strategies import AGENTS, TASK_SOURCES
from trollout.collector.deployment import Route
from trollout.errors import DeploymentError


@attrs.frozen
class EnvironmentServer:
    """An environment server as the planner reads it."""

    implementation: str | None


@attrs.define
class TableRouter:
    """Answers the planner's questions from plain tables.

    Attributes:
        agents: agent name -> environment server fronting it (None: reached directly).
        datasets: dataset name (task_source) -> agents declaring it.
        allowed: dataset name -> the agents its ``allowed_agents`` admits.
        environments: environment server name -> implementation (``_ng_result_type``).
    """

    agents: dict[str, str | None]
    datasets: dict[str, list[str]] = attrs.field(factory=dict)
    allowed: dict[str, set[str]] = attrs.field(factory=dict)
    environments: dict[str, str | None] = attrs.field(factory=dict)

    @property
    def known_agents(self) -> frozenset[str]:
        """Every agent name."""
        return frozenset(self.agents)

    def route(self, agent_name: str) -> Route:
        """Route to the fronting environment server, or to the agent itself."""
        env = self.agents[agent_name]
        impl = self.environments.get(env) if env else None
        return Route(agent_name, f"http://127.0.0.1/{agent_name}", env, impl)

    def agent_for_task_source(self, task_source: str) -> str | None:
        """Return the one agent declaring the dataset, or None; refuse several."""
        owners = self.datasets.get(task_source, [])
        if len(owners) > 1:
            raise DeploymentError(f"task_source {task_source!r} is a dataset of {owners}")
        return owners[0] if owners else None

    def admission_refusal(self, agent_name: str, task_source: str | None = None) -> str | None:
        """Refuse agents a dataset's allowed_agents leaves out."""
        allowed = self.allowed.get(task_source) if task_source else None
        if allowed is not None and agent_name not in allowed:
            return f"dataset {task_source!r} does not admit agent {agent_name!r} (allowed_agents)"
        return None

    def environment_server(self, name: str) -> EnvironmentServer:
        """Return an environment server, or raise DeploymentError."""
        if name not in self.environments:
            raise DeploymentError(f"unknown environment server {name!r}")
        return EnvironmentServer(self.environments[name])


def direct_router(agents: Iterable[str] = AGENTS, **tables: Mapping[str, object]) -> TableRouter:
    """Return an earlier-generation router: agents reached directly, no environment servers."""
    return TableRouter(agents=dict.fromkeys(agents), **tables)  # type: ignore[arg-type]


def strategies_router() -> TableRouter:
    """Return the router `strategies.rows()` is routed by: each dataset declared by one agent."""
    return direct_router(datasets={ds: [AGENTS[i]] for i, ds in enumerate(TASK_SOURCES)})
