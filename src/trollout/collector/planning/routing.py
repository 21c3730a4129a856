"""Routing for the plan: which agents and servers run a row, and how many times.

The planner asks the deployment through the `router.Router` protocol; the rules it applies:

Rules (docs/protocol.md sections 3 and 5, NeMo Gym 0.7.0), for a flat row whose agent is
``agent_ref.name``:

1. ``fan_out[row agent]``, else ``fan_out[task_source]``: the row runs once per listed agent.
2. ``agent_map[row agent]`` > ``agent_map[task_source]`` > ``agent_map._default`` > the row's
   agent > the agent ``task_source`` resolves to > the deployment's only agent, when it has
   exactly one and the row names neither an agent nor a ``task_source``. ``agent_name X``
   *replaces* ``agent_map`` with ``{_default: X}``, so it re-routes every row that no fan-out
   matches.
3. The environment server: ``agent`` mode, the one fronting the agent (``Route``); ``legacy``,
   ``environment_server_name`` for every flat row; ``taskset``, flat rows are refused (and
   ``environment_server_routes`` is required).
4. Legacy mode never resolves ``task_source``: a row naming no agent runs on the agent the
   environment server binds, a row naming another agent is refused, and so is a ``task_source``
   naming neither the server's resources server nor its agent (the instances that may have
   declared the rows' dataset).

A task row (``task_id: {taskset, task_id}``) names no agent and goes to
``environment_server_routes[taskset]`` in every mode; ``agent_map`` and ``fan_out`` never apply
to it. Its pairing is checked with the agent its environment server binds. ``num_repeats`` may
be a mapping: a flat row takes its agent's entry, a task row its taskset's, then ``_default``
(1 when absent). Each of its keys (and ``num_repeats_add_seed``'s) must be ``_default``, an
agent the deployment serves, or (``num_repeats``) a taskset of the rows: any other key would
change nothing, a typo taken in silence, so it is refused (`Resolver.check_keys`, once every
row has been seen).

The only agent: a run with one ``--agent-url`` (or a deployment serving one agent) has no
choice to make, so asking for ``+agent_name`` named the one agent the user had just given
(issue 25's trainer friction). With two agents or more, a row naming none is still refused, as
NeMo Gym refuses it: which one is the user's to say. Rejected: any agent a row's
``task_source`` cannot resolve to falling back on the only agent (a ``task_source`` naming an
instance the deployment lacks is a mistake worth reporting whatever the agent count).

Resolution depends only on (row agent, task_source) or the taskset, so it is cached per key and
the router is asked once per distinct key, not once per row.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Set
from typing import Any, Final, NamedTuple

from ...errors import DeploymentError
from ...records import is_mapping
from ...settings import TASKSET_NEEDS_ROUTES, RunConfig, repeats_problems
from .input_file import Problems, is_task_row
from .router import EnvironmentServerInfo, Router

__all__ = ["Copy", "Issue", "Resolution", "Resolver"]

DEFAULT: Final = "_default"
_MODES: Final = ("agent", "legacy", "taskset")
_MAX_CACHE: Final = 4096
_MAX_NAMES: Final = 10
_PAIRING_REMEDY: Final = "route these rows to an agent of an accepted type"


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
        self._seeds = config.num_repeats_add_seed
        self._tasksets: set[str] = set()  # the tasksets of the rows that num_repeats names
        self._mode = config.environment_routing_mode
        self._legacy_server = config.environment_server_name
        self._legacy: EnvironmentServerInfo | None = None
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

    def check_keys(self, problems: Problems) -> None:
        """Refuse per-agent keys that name no agent and no taskset (call after every row)."""
        settings: tuple[tuple[str, object, Set[str]], ...] = (
            ("num_repeats", self._repeats, self._tasksets),
            ("num_repeats_add_seed", self._seeds, frozenset()),
        )
        for name, setting, tasksets in settings:
            if not isinstance(setting, Mapping):
                continue
            for key in sorted(set(setting) - self._known - tasksets - {DEFAULT}):
                also = " nor a taskset of the rows" if name == "num_repeats" else ""
                problems.config(
                    f"{name}.{key}: {key!r} is not an agent of the run (agents: "
                    f"{_names(self._known)}){also}, so it would change nothing; fix the name, "
                    "or drop it"
                )

    def repeats_for(self, key: str | None) -> int:
        """Return ``num_repeats`` for an agent or a taskset (else ``_default``, else 1)."""
        repeats = self._repeats
        if not isinstance(repeats, Mapping):
            return repeats
        if key is not None and key in repeats:
            return repeats[key]
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
        if self._mode == "legacy":
            return self._bound_agent()
        return self._task_source_agent(task_source)

    def _bound_agent(self) -> list[tuple[str, str]] | Issue:
        if self._legacy is None:
            return []  # an unknown environment_server_name is already a problem
        bound = self._legacy.agent_server
        if bound is None:
            return Issue(
                ("no agent", None),
                f"no agent: no agent_ref.name, and environment server {self._legacy_server!r} "
                "binds none (no agent_server)",
                "add agent_ref.name to the rows, or pass +agent_name=<agent>",
            )
        return [(bound, f"environment server {self._legacy_server!r}")]

    def _task_source_agent(self, task_source: str | None) -> list[tuple[str, str]] | Issue:
        if task_source is None:
            if len(self._known) == 1:
                (only,) = self._known
                return [(only, "the deployment's only agent")]
            return Issue(
                ("no agent", None),
                "no agent: no agent_ref.name, no task_source",
                "add agent_ref.name to the rows, or pass +agent_name=<agent>",
            )
        try:
            owner = self._router.agent_for_task_source(task_source)
        except DeploymentError as exc:
            return Issue(("task_source", task_source), str(exc), "")
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
        if self._mode == "legacy":
            return self._legacy_copy(name, via, task_source)
        refusal = self._refusal(name, via, task_source)
        if refusal is not None:
            return refusal
        try:
            route = self._router.route(name)
        except DeploymentError as exc:
            return Issue(("route", name), str(exc), "")
        return Copy(name, route.environment_server, route.result_type, self.repeats_for(name))

    def _refusal(self, name: str, via: str, task_source: str | None) -> Issue | None:
        refusal = self._router.admission_refusal(name, task_source)
        if refusal is None:
            return None
        what = f"agent {name!r} (from {via}) is not admitted: {refusal}"
        return Issue(("refused", name, task_source), what, _PAIRING_REMEDY)

    def _legacy_copy(self, name: str, via: str, task_source: str | None) -> Copy | Issue:
        server, info = self._legacy_server, self._legacy
        impl = info.implementation if info is not None else None
        bound = info.agent_server if info is not None else None
        verifier = info.resources_server if info is not None else None
        if bound is not None and name != bound:
            return Issue(
                ("legacy agent", name),
                f"agent {name!r} (from {via}) is not the agent environment server {server!r} "
                f"fronts ({bound!r})",
                f"drop agent_ref from these rows to run them on {bound!r}, or pass "
                "+environment_server_name=<the server fronting the agent>",
            )
        if task_source not in (None, verifier, name) and verifier is not None:
            return Issue(
                ("legacy task_source", task_source),
                f"task_source {task_source!r} names neither the resources server environment "
                f"server {server!r} runs against ({verifier!r}) nor the agent running them "
                f"({name!r})",
                "fix task_source in the rows, or choose another environment_server_name",
            )
        refusal = self._refusal(name, via, verifier if verifier is not None else task_source)
        return refusal or Copy(name, server, impl, self.repeats_for(name))

    # --- task rows ------------------------------------------------------------------------

    def _task_row(self, taskset: str) -> Resolution:
        if isinstance(self._repeats, Mapping) and taskset in self._repeats:
            self._tasksets.add(taskset)
        server = self._routes.get(taskset)
        if server is None:
            return _refused(
                ("no route", taskset),
                f"task rows of taskset {taskset!r} have no route in environment_server_routes",
                f"pass +environment_server_routes={{{taskset}:<environment server>}}",
            )
        try:
            info = self._router.environment_server(server)
        except DeploymentError as exc:
            return _refused(("server", server), f"environment_server_routes.{taskset}: {exc}", "")
        agent = info.agent_server
        refusal = (
            self._router.admission_refusal(agent, info.resources_server, taskset)
            if agent is not None and agent in self._known
            else None
        )
        if refusal is not None:
            return _refused(
                ("refused", server, taskset),
                f"task rows of taskset {taskset!r} go to environment server {server!r}, whose "
                f"agent is not admitted: {refusal}",
                _PAIRING_REMEDY,
            )
        copy = Copy(None, server, info.implementation, self.repeats_for(taskset))
        return Resolution((copy,), ())

    # --- settings -------------------------------------------------------------------------

    def _check_routing_mode(self, problems: Problems) -> None:
        if self._mode not in _MODES:
            problems.config(
                f"environment_routing_mode must be one of {', '.join(_MODES)} "
                f"(got {self._mode!r}); pass +environment_routing_mode=agent"
            )
        elif self._mode == "legacy":
            self._check_legacy(problems)
        elif self._mode == "taskset" and not self._routes:
            problems.config(TASKSET_NEEDS_ROUTES)

    def _check_legacy(self, problems: Problems) -> None:
        if not self._legacy_server:
            problems.config(
                "environment_routing_mode 'legacy' needs environment_server_name; pass "
                "+environment_server_name=<environment server>"
            )
            return
        try:
            self._legacy = self._router.environment_server(self._legacy_server)
        except DeploymentError as exc:
            problems.config(f"environment_server_name: {exc}")


def _key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    if is_task_row(row):
        return ("task", row["task_id"]["taskset"])
    ref = row.get("agent_ref")
    return ("flat", ref.get("name") if is_mapping(ref) else None, row.get("task_source"))


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
