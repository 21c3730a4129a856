"""The deployment as the planner sees it: five questions, asked through a protocol.

The planner asks a `Router` (implemented by `deployment.Deployment`; tests pass a small table)
five questions, and nothing else:

- ``known_agents``: the agent names the deployment serves;
- ``route(agent)``: where that agent's rows go (`RouteInfo`: a `deployment.Route`, read
  through a protocol so planning imports nothing of deployment); may raise `DeploymentError`
  (an agent fronted by two environment servers);
- ``agent_for_task_source(name)``: the agent that runs rows whose only route is the config
  instance ``name`` (the one that declared their dataset); raises `DeploymentError` saying why
  there is no single such agent;
- ``admission_refusal(agent, task_source, taskset)``: why the ``allowed_agents`` of the rows'
  verifiers or declaring datasets refuse the agent's type, or None when it is admitted;
- ``environment_server(name)``: an environment server (its ``implementation`` is the
  ``_ng_result_type``; ``agent_server`` the agent it binds; ``resources_server`` its verifier);
  raises `DeploymentError` when there is none of that name.

A protocol rather than `deployment.Deployment` itself, so planning imports nothing of
deployment discovery (tests/test_layering.py): the planner needs the answers, not the HTTP
client that fetched the served config.
"""

from __future__ import annotations

from collections.abc import Set
from typing import Protocol

__all__ = ["EnvironmentServerInfo", "RouteInfo", "Router"]


class EnvironmentServerInfo(Protocol):
    """What the planner reads of an environment server."""

    @property
    def implementation(self) -> str | None:
        """The implementation name, stamped as ``_ng_result_type``."""
        ...

    @property
    def agent_server(self) -> str | None:
        """The agent it binds (fronts), if any."""
        ...

    @property
    def resources_server(self) -> str | None:
        """The resources server it runs against, if it names one."""
        ...


class RouteInfo(Protocol):
    """What the planner reads of where an agent's rows go (`deployment.Route`)."""

    @property
    def environment_server(self) -> str | None:
        """The environment server fronting the agent, if any."""
        ...

    @property
    def result_type(self) -> str | None:
        """That server's implementation name (``_ng_result_type``), if any."""
        ...


class Router(Protocol):
    """The deployment as the planner sees it (see the module docstring)."""

    @property
    def known_agents(self) -> Set[str]:
        """Every agent name the deployment serves."""
        ...

    def route(self, agent_name: str) -> RouteInfo:
        """Return where rows of a known agent go."""
        ...

    def agent_for_task_source(self, task_source: str) -> str:
        """Return the agent running rows routed by ``task_source`` (raise `DeploymentError`)."""
        ...

    def admission_refusal(
        self, agent_name: str, task_source: str | None = None, taskset: str | None = None
    ) -> str | None:
        """Return why the agent may not run these rows, or None."""
        ...

    def environment_server(self, name: str) -> EnvironmentServerInfo:
        """Return the environment server ``name`` (raise `DeploymentError` if unknown)."""
        ...
