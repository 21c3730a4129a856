"""The deployment: which servers a run talks to, and where each row's `/run` goes.

(Interface stub: a helper fills in discovery; `Route` and `Deployment`'s public methods below are
the contract plan.py and engine.py rely on.)
"""

from __future__ import annotations

from attrs import frozen

__all__ = ["Deployment", "Route"]


@frozen
class Route:
    """Where one agent's rollouts go.

    Attributes:
        agent_name: the agent (``agent_ref.name``).
        url: base URL (``http://host:port``) that receives ``POST /run`` for this agent: the
            environment server fronting it in a 0.7.0 deployment, else the agent server.
        environment_server: the 0.7.0 environment server's instance name, or None.
        result_type: that server's implementation name (``_ng_result_type``), or None.
    """

    agent_name: str
    url: str
    environment_server: str | None = None
    result_type: str | None = None


class Deployment:
    """Placeholder; see the helper's implementation."""
