"""Fixtures for the fake deployment's own tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from trollout.testing import AgentSpec, DeploymentSpec, FakeDeployment, open_fake_deployment


@pytest.fixture
def spec() -> DeploymentSpec:
    """Return a small 0.7.0 spec: two agents, no latency, no faults."""
    return DeploymentSpec(agents=(AgentSpec(name="math_agent"), AgentSpec(name="string_agent")))


@pytest.fixture
async def fake(spec: DeploymentSpec) -> AsyncIterator[FakeDeployment]:
    """Serve ``spec`` on loopback for one test."""
    async with open_fake_deployment(spec) as deployment:
        yield deployment


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    """Return an httpx client without timeouts (tests bound time themselves)."""
    async with httpx.AsyncClient(timeout=None) as c:
        yield c
