"""Routing for the plan: which agents and servers run a row, and how many times.

The planner asks a `Router` (implemented by `deployment.Deployment`; tests pass a small table)
five questions, and nothing else:

- ``known_agents``: the agent names the deployment serves;
- ``route(agent)``: where that agent's rows go (`deployment.Route`); may raise `DeploymentError`
  (an agent fronted by two environment servers);
- ``agent_for_task_source(name)``: the one agent declaring a dataset of that name, or None; may
  raise `DeploymentError` (several agents declare it);
- ``admission_refusal(agent, task_source)``: why a dataset's or resources server's
  ``allowed_agents`` refuses the agent, or None when it is admitted;
- ``environment_server(name)``: an environment server (its ``implementation`` is the
  ``_ng_result_type``); raises `DeploymentError` when there is none of that name.

Rules (protocol.md sections 3 and 5), for a flat row whose agent is ``agent_ref.name``:

1. ``fan_out[row agent]``, else ``fan_out[task_source]``: the row runs once per listed agent.
2. ``agent_map[row agent]`` > ``agent_map[task_source]`` > ``agent_map._default`` > the row's
   agent > the agent declaring a dataset named ``task_source``. ``agent_name X`` *replaces*
   ``agent_map`` with ``{_default: X}``, so it re-routes every row that no fan-out matches.
3. The environment server: ``agent`` mode, the one fronting the agent (``Route``); ``legacy``,
   ``environment_server_name`` for every flat row; ``taskset``, flat rows are refused.

A task row (``task_id: {taskset, task_id}``) names no agent and goes to
``environment_server_routes[taskset]`` in every mode. ``num_repeats`` may be per agent
(``{agent: n, _default: n}``); task rows take ``_default`` (1 when absent).

Resolution depends only on (row agent, task_source) or the taskset, so it is cached per key and
the router is asked once per distinct key, not once per row.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Set
from typing import Any, Final, NamedTuple, Protocol

from ..config import RunConfig, repeats_problems
from ..errors import DeploymentError
from .deployment import Route
from .plan_input import Problems, is_task_row

__all__ = ["Copy", "EnvironmentServerInfo", "Issue", "Resolution", "Resolver", "Router"]

DEFAULT: Final = "_default"
_MODES: Final = ("agent", "legacy", "taskset")
_MAX_CACHE: Final = 4096
_MAX_NAMES: Final = 10


class EnvironmentServerInfo(Protocol):
    """What the planner reads of an environment server."""

    @property
    def implementation(self) -> str | None:
        """The implementation name, stamped as ``_ng_result_type``."""
        ...


class Router(Protocol):
    """The deployment as the planner sees it (see the module docstring)."""

    @property
    def known_agents(self) -> Set[str]:
        """Every agent name the deployment serves."""
        ...

    def route(self, agent_name: str) -> Route:
        """Return where rows of a known agent go."""
        ...

    def agent_for_task_source(self, task_source: str) -> str | None:
        """Return the one agent declaring a dataset named ``task_source``, or None."""
        ...

    def admission_refusal(self, agent_name: str, task_source: str | None = None) -> str | None:
        """Return why the agent may not run rows of ``task_source``, or None."""
        ...

    def environment_server(self, name: str) -> EnvironmentServerInfo:
        """Return the environment server ``name`` (raise `DeploymentError` if unknown)."""
        ...


class Copy(NamedTuple):
    """One agent's share of a row: who runs it, where, and how many times."""

    agent: str | None  # None for a task row
    environment_server: str | None
    result_type: str | None
    repeats: int

    @property
    def group(self) -> tuple[str | None, str | None]:
        """Return the round-robin key: (agent, environment server)."""
        return (self.agent, self.environment_server)


class Issue(NamedTuple):
    """A routing problem, reported once per key with a count."""

    key: Hashable
    what: str
    remedy: str


class Resolution(NamedTuple):
    """The copies of a row, or why it cannot be routed."""

    copies: tuple[Copy, ...]
    issues: tuple[Issue, ...]


class Resolver:
    """Resolve rows to copies per the rules in the module docstring (cached per key)."""

    def __init__(self, config: RunConfig, router: Router, problems: Problems) -> None:
        self._router = router
        self._known = router.known_agents
        self._via_default = "agent_name" if config.agent_name else f"agent_map.{DEFAULT}"
        self._agent_map = {DEFAULT: config.agent_name} if config.agent_name else config.agent_map
        bad_fan_out = _fan_out_problems(config.fan_out)
        self._fan_out = {k: v for k, v in config.fan_out.items() if k not in bad_fan_out}
        self._repeats = config.num_repeats
        self._mode = config.environment_routing_mode
        self._legacy_server = config.environment_server_name
        self._legacy_type: str | None = None
        self._routes = config.environment_server_routes
        self._cache: dict[Hashable, Resolution] = {}
        for message in repeats_problems(self._repeats) + list(bad_fan_out.values()):
            problems.config(message)
        self._check_routing_mode(problems)

    def resolve(self, row: Mapping[str, Any]) -> Resolution:
        """Return the copies of a row (valid shape), or its routing issues."""
        key = _key(row)
        found = self._cache.get(key)
        if found is None:
            found = self._task_row(key[1]) if key[0] == "task" else self._flat_row(*key[1:])
            if len(self._cache) < _MAX_CACHE:
                self._cache[key] = found
        return found

    def repeats_for(self, agent: str | None) -> int:
        """Return ``num_repeats`` for an agent (task rows: ``_default``)."""
        repeats = self._repeats
        if not isinstance(repeats, Mapping):
            return repeats
        if agent is not None and agent in repeats:
            return repeats[agent]
        return repeats.get(DEFAULT, 1)

    # --- flat rows ------------------------------------------------------------------------

    def _flat_row(self, agent: str | None, task_source: str | None) -> Resolution:
        if self._mode == "taskset":
            return _refused(
                ("taskset mode",),
                "flat rows (no task_id), but environment_routing_mode is 'taskset'",
                "convert them to task rows, or pass +environment_routing_mode=agent",
            )
        choices = self._agents(agent, task_source)
        if isinstance(choices, Issue):
            return Resolution((), (choices,))
        results = [self._flat_copy(name, via, task_source) for name, via in choices]
        issues = tuple(r for r in results if isinstance(r, Issue))
        return Resolution(tuple(r for r in results if isinstance(r, Copy)), issues)

    def _agents(self, agent: str | None, task_source: str | None) -> list[tuple[str, str]] | Issue:
        for key in (agent, task_source):
            if key is not None and key in self._fan_out:
                return [(name, f"fan_out.{key}") for name in self._fan_out[key]]
        for key in (agent, task_source):
            if key is not None and key in self._agent_map:
                return [(self._agent_map[key], f"agent_map.{key}")]
        if DEFAULT in self._agent_map:
            return [(self._agent_map[DEFAULT], self._via_default)]
        if agent is not None:
            return [(agent, "agent_ref.name")]
        return self._task_source_agent(task_source)

    def _task_source_agent(self, task_source: str | None) -> list[tuple[str, str]] | Issue:
        remedy = "add agent_ref.name to the rows, or pass +agent_name=<agent>"
        if task_source is None:
            return Issue(("no agent", None), "no agent: no agent_ref.name, no task_source", remedy)
        try:
            owner = self._router.agent_for_task_source(task_source)
        except DeploymentError as exc:
            return Issue(("task_source", task_source), str(exc), "")
        if owner is None:
            return Issue(
                ("no agent", task_source),
                f"no agent: no agent_ref.name, and no agent declares a dataset named "
                f"task_source {task_source!r}",
                remedy,
            )
        return [(owner, f"task_source {task_source!r}")]

    def _flat_copy(self, name: str, via: str, task_source: str | None) -> Copy | Issue:
        if name not in self._known:
            fix = (
                f"fix agent_ref.name, or map it with +agent_map={{{name}:<agent>}}"
                if via == "agent_ref.name"
                else f"fix {via}"
            )
            what = f"unknown agent {name!r} (from {via}); known agents: {_names(self._known)}"
            return Issue(("unknown", name), what, fix)
        refusal = self._router.admission_refusal(name, task_source)
        if refusal is not None:
            what = f"agent {name!r} (from {via}) is not admitted: {refusal}"
            return Issue(("refused", name, task_source), what, "route these rows to another agent")
        if self._mode == "legacy":
            return Copy(name, self._legacy_server, self._legacy_type, self.repeats_for(name))
        try:
            route = self._router.route(name)
        except DeploymentError as exc:
            return Issue(("route", name), str(exc), "")
        return Copy(name, route.environment_server, route.result_type, self.repeats_for(name))

    # --- task rows ------------------------------------------------------------------------

    def _task_row(self, taskset: str) -> Resolution:
        server = self._routes.get(taskset)
        if server is None:
            return _refused(
                ("no route", taskset),
                f"task rows of taskset {taskset!r} have no route in environment_server_routes",
                f"pass +environment_server_routes={{{taskset}:<environment server>}}",
            )
        try:
            result_type = self._router.environment_server(server).implementation
        except DeploymentError as exc:
            return _refused(("server", server), f"environment_server_routes.{taskset}: {exc}", "")
        return Resolution((Copy(None, server, result_type, self.repeats_for(None)),), ())

    # --- settings -------------------------------------------------------------------------

    def _check_routing_mode(self, problems: Problems) -> None:
        if self._mode not in _MODES:
            problems.config(
                f"environment_routing_mode must be one of {', '.join(_MODES)} "
                f"(got {self._mode!r}); pass +environment_routing_mode=agent"
            )
        elif self._mode == "legacy":
            self._check_legacy(problems)

    def _check_legacy(self, problems: Problems) -> None:
        if not self._legacy_server:
            problems.config(
                "environment_routing_mode 'legacy' needs environment_server_name; pass "
                "+environment_server_name=<environment server>"
            )
            return
        try:
            self._legacy_type = self._router.environment_server(self._legacy_server).implementation
        except DeploymentError as exc:
            problems.config(f"environment_server_name: {exc}")


def _key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    if is_task_row(row):
        return ("task", row["task_id"]["taskset"])
    ref = row.get("agent_ref")
    return ("flat", ref.get("name") if isinstance(ref, Mapping) else None, row.get("task_source"))


def _refused(key: Hashable, what: str, remedy: str) -> Resolution:
    return Resolution((), (Issue(key, what, remedy),))


def _names(names: Set[str]) -> str:
    listed = sorted(names)
    more = f", ... ({len(listed) - _MAX_NAMES} more)" if len(listed) > _MAX_NAMES else ""
    return ", ".join(listed[:_MAX_NAMES]) + more if listed else "(none)"


def _fan_out_problems(fan_out: Mapping[str, Any]) -> dict[str, str]:
    return {
        key: f"fan_out.{key} must be a non-empty list of agent names (got {agents!r}); "
        "list at least one agent"
        for key, agents in fan_out.items()
        if not isinstance(agents, list)
        or not agents
        or not all(isinstance(a, str) and a for a in agents)
    }
