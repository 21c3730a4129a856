"""A tiny table-driven `Router` for the plan tests (the real one is `deployment.Deployment`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from strategies import AGENTS, TASK_SOURCES
from trollout.collector.deployment.discovery import Route
from trollout.errors import DeploymentError


@attrs.frozen
class EnvironmentServer:
    """An environment server as the planner reads it."""

    implementation: str | None
    agent_server: str | None = None
    resources_server: str | None = None


@attrs.define
class TableRouter:
    """Answers the planner's questions from plain tables.

    Attributes:
        agents: agent name -> environment server fronting it (None: reached directly).
        task_sources: task_source instance -> the agents it could resolve to (exactly one
            resolves; none or several is refused, as the real router refuses them).
        allowed: task_source or taskset -> the agents admitted to run its rows.
        environments: environment server name -> implementation (``_ng_result_type``), or an
            `EnvironmentServer` that also binds an agent or a resources server.
    """

    agents: dict[str, str | None]
    task_sources: dict[str, list[str]] = attrs.field(factory=dict)
    allowed: dict[str, set[str]] = attrs.field(factory=dict)
    environments: dict[str, str | EnvironmentServer | None] = attrs.field(factory=dict)

    @property
    def known_agents(self) -> frozenset[str]:
        """Every agent name."""
        return frozenset(self.agents)

    def route(self, agent_name: str) -> Route:
        """Route to the fronting environment server, or to the agent itself."""
        env = self.agents[agent_name]
        impl = self.environment_server(env).implementation if env else None
        return Route(agent_name, f"http://127.0.0.1/{agent_name}", env, impl)

    def agent_for_task_source(self, task_source: str) -> str:
        """Return the one agent of the task_source; refuse none or several."""
        owners = self.task_sources.get(task_source, [])
        if len(owners) != 1:
            raise DeploymentError(f"task_source {task_source!r} resolves to {owners}")
        return owners[0]

    def admission_refusal(
        self, agent_name: str, task_source: str | None = None, taskset: str | None = None
    ) -> str | None:
        """Refuse agents the allowed table leaves out for the task_source or the taskset."""
        for key in (task_source, taskset):
            allowed = self.allowed.get(key) if key else None
            if allowed is not None and agent_name not in allowed:
                return f"{key!r} does not admit agent {agent_name!r}"
        return None

    def environment_server(self, name: str) -> EnvironmentServer:
        """Return an environment server, or raise DeploymentError."""
        if name not in self.environments:
            raise DeploymentError(f"unknown environment server {name!r}")
        server = self.environments[name]
        return server if isinstance(server, EnvironmentServer) else EnvironmentServer(server)


def direct_router(agents: Iterable[str] = AGENTS, **tables: Mapping[str, object]) -> TableRouter:
    """Return an earlier-generation router: agents reached directly, no environment servers."""
    return TableRouter(agents=dict.fromkeys(agents), **tables)  # type: ignore[arg-type]


def strategies_router() -> TableRouter:
    """Return the router `strategies.rows()` is routed by: each task_source has one agent."""
    return direct_router(task_sources={ds: [AGENTS[i]] for i, ds in enumerate(TASK_SOURCES)})
