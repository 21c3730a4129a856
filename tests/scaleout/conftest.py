"""Fixtures of the distributed-run tests: a fake deployment in its own process.

The Ray tests (`trollout.scaleout.ray`'s) live in ``on_ray/``, not ``ray/``: this folder is on
``sys.path`` (pytest puts a conftest's folder there), where a ``ray/`` folder would be imported
as a namespace package named ``ray`` whenever Ray is not installed, so the tests' skip-if-no-Ray
would not skip and ``import ray`` would find the tests instead of the library.
"""

from __future__ import annotations

import os

import pytest

from trollout.testing import AgentSpec, DeploymentSpec, Latency

# A Ray cluster of this machine binds loopback only when this is set before Ray is imported.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


@pytest.fixture(scope="package")
def fake_spec() -> DeploymentSpec:
    """Unlike the shared fake's: every /run takes 20 ms, no detailed /run log."""
    return DeploymentSpec(
        agents=(AgentSpec(name="math_agent"),), latency=Latency(fixed_s=0.02), record_runs=False
    )


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the selected Slurm scenarios now, beside the suite (`slurm_session`)."""
    from slurm_scenarios import SCENARIOS
    from slurm_session import start_in_background

    selected = {item.name for item in session.items}
    start_in_background([name for name in SCENARIOS if name in selected])


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Wait for the Slurm scenarios (bounded) and stop the session's Slurm, by pid."""
    import sys

    if "slurm_session" in sys.modules:
        sys.modules["slurm_session"].finish(timeout_s=60)
