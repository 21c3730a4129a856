"""Shared fixtures: hypothesis profiles, the fake deployment, and small builders.

`fake` is the one fixture for the bundled fake deployment in its own process, one per module.
It serves `fake_spec` (one agent, ``math_agent``); a module whose deployment differs overrides
`fake_spec` alone, so what differs is stated there and nowhere else. Fixtures that differ in
kind (one deployment per test, one following a fault script) have names of their own.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from trollout.testing import AgentSpec, DeploymentSpec, FakeUrls, spawn_fake_deployment

settings.register_profile(
    "ci", max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=25, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A loopback port that accepts connections but never answers (count them: `connections`)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    sock.setblocking(False)
    yield sock
    sock.close()


@pytest.fixture(scope="module")
def fake_spec() -> DeploymentSpec:
    """The deployment `fake` serves: one agent, ``math_agent`` (a module overrides this)."""
    return DeploymentSpec(agents=(AgentSpec(name="math_agent"),))


@pytest.fixture(scope="module")
def fake(fake_spec: DeploymentSpec) -> Iterator[FakeUrls]:
    """The fake deployment serving `fake_spec` in its own process, shared by a module's tests."""
    with spawn_fake_deployment(fake_spec) as urls:
        yield urls
