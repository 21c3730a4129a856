"""Fixtures of the distributed-run tests: a fake deployment in its own process."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from trollout.testing import AgentSpec, DeploymentSpec, FakeUrls, Latency, spawn_fake_deployment

# A Ray cluster of this machine binds loopback only when this is set before Ray is imported.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


@pytest.fixture(scope="package")
def fake() -> Iterator[FakeUrls]:
    """A fake deployment whose /run takes 20 ms, in its own process."""
    spec = DeploymentSpec(
        agents=(AgentSpec(name="math_agent"),), latency=Latency(fixed_s=0.02), record_runs=False
    )
    with spawn_fake_deployment(spec) as urls:
        yield urls
