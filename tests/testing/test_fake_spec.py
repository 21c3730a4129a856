"""Deployment specs: YAML loading, validation, round trips and the fixture files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trollout.errors import ConfigError
from trollout.testing import (
    AgentSpec,
    DeploymentSpec,
    Fault,
    FaultPlan,
    Generation,
    Latency,
    load_spec,
    spec_from_dict,
    spec_to_dict,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def test_demo_fixture_is_a_0_7_0_deployment_with_two_agents() -> None:
    """The demo spec has environment servers, two agents, latency and a few percent faults."""
    spec = load_spec(FIXTURES / "demo_deployment.yaml")
    assert spec.generation is Generation.V0_7_0
    assert [a.name for a in spec.agents] == ["math_agent", "string_agent"]
    assert spec.latency.fixed_s > 0
    assert 0 < spec.faults.rate <= 0.1


def test_legacy_fixture_is_a_legacy_deployment() -> None:
    """The legacy spec has no environment servers."""
    assert load_spec(FIXTURES / "legacy_deployment.yaml").generation is Generation.LEGACY


def test_spec_round_trips_through_a_mapping() -> None:
    """spec_to_dict then spec_from_dict gives an equal spec."""
    plan = FaultPlan(
        seed=2,
        rate=0.5,
        mix=((Fault(kind="status", status=503, retry_after=1.5), 2.0), (Fault(kind="hang"), 1.0)),
        max_attempt=1,
    )
    spec = DeploymentSpec(
        agents=(
            AgentSpec(name="a", accuracy=0.3, latency=Latency(fixed_s=1.0), faults=plan),
            AgentSpec(name="b", refuse=True),
        ),
        generation=Generation.LEGACY,
        latency=Latency(fixed_s=0.5, jitter_s=0.25, seed=3),
        faults=plan,
        policy_seed=9,
    )
    assert spec_from_dict(spec_to_dict(spec)) == spec


def test_spec_agents_may_be_plain_names() -> None:
    """A list of names is a list of default agents."""
    spec = spec_from_dict({"agents": ["x", {"name": "y", "latency": 0.5}]})
    assert spec.agents == (AgentSpec(name="x"), AgentSpec(name="y", latency=Latency(fixed_s=0.5)))


def test_for_benchmark_is_fault_free_without_a_run_log() -> None:
    """The benchmark spec has the named agents, a fixed latency, no faults, no /run log."""
    spec = DeploymentSpec.for_benchmark(["bench_agent"], latency_s=5.0)
    assert [a.name for a in spec.agents] == ["bench_agent"]
    assert spec.latency == Latency(fixed_s=5.0)
    assert (spec.faults, spec.record_runs) == (FaultPlan(), False)


def test_with_sleep_makes_every_run_sleep_without_faults() -> None:
    """The benchmark mode: fixed latency everywhere, no faults."""
    spec = load_spec(FIXTURES / "demo_deployment.yaml").with_sleep(30.0)
    assert spec.latency == Latency(fixed_s=30.0)
    assert spec.faults == FaultPlan()
    assert all(a.latency is None and a.faults is None for a in spec.agents)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"agentz": []}, "unknown deployment spec keys \\['agentz'\\]"),
        ({"agents": []}, "at least one agent"),
        ({"agents": ["a", "a"]}, "must be unique"),
        ({"generation": "0.6"}, "invalid deployment spec"),
        ({"latency": {"fixed_s": -1}}, "latency must be >= 0"),
        ({"faults": {"rate": 0.1, "mix": [{"kind": "nope"}]}}, "unknown fault kind 'nope'"),
    ],
)
def test_spec_from_dict_refuses_bad_specs(data: dict[str, Any], message: str) -> None:
    """Bad specs are refused with a message naming the problem."""
    with pytest.raises(ConfigError, match=message):
        spec_from_dict(data)


def test_load_spec_names_the_file(tmp_path: Path) -> None:
    """A bad spec file's error names the file."""
    path = tmp_path / "bad.yaml"
    path.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml"):
        load_spec(path)


def test_spec_agent_lookup_names_known_agents() -> None:
    """Asking for an unknown agent lists the known ones."""
    with pytest.raises(ConfigError, match="known: \\['math_agent', 'string_agent'\\]"):
        DeploymentSpec().agent("nope")
    assert DeploymentSpec().agent("math_agent").name == "math_agent"
