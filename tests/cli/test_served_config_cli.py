"""`trollout collect` against configs as NeMo Gym 0.7.0 head servers serve them (issue 9).

A real head server serves its config before OmegaConf resolves it. These tests collect through
such configs end to end, and check that every refusal on the new routing paths (tasksets,
environment server routes, task_source instances, pairings) is one line, exit 2, nothing
written and nothing dispatched.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from builders import connections, invoke, serve_head_config
from trollout.testing import (
    FAKE_API_KEY,
    AgentSpec,
    DeploymentSpec,
    build_config,
    spawn_fake_deployment,
)

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "nemo_gym_0.7.0_served_config.yaml"
FIXTURE_SECRET = "sk-fixture-9c2e71d04b5a-SECRET"
AGENT = "example_single_tool_call_simple_agent"
ENV = "example_single_tool_call_environment_server"
RS = "example_single_tool_call"
PROMPT = {"responses_create_params": {"input": [{"role": "user", "content": "What is 2 + 2?"}]}}


class _NoAliasDumper(yaml.SafeDumper):
    """Write shared values out in full, as a head server does (trollout refuses aliases)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def served(cfg: dict[str, Any]) -> str:
    """Return ``cfg`` as the YAML text a head server serves."""
    return yaml.dump(cfg, Dumper=_NoAliasDumper, sort_keys=False)


def fixture_config(port: int) -> dict[str, Any]:
    """Return the served-config fixture with every server's port on ``port``."""
    cfg: dict[str, Any] = yaml.safe_load(FIXTURE.read_text())
    for name in (RS, AGENT, "policy_model"):
        [block] = [b for impls in cfg[name].values() for b in impls.values()]
        block["port"] = port
    cfg["environment_server_port"] = port  # the environment server's port reads this key
    return cfg


def collect(tmp_path: Path, head_url: str, rows: list[dict[str, Any]], *extra: str) -> Any:
    """Run ``trollout collect`` on ``rows`` through the head server at ``head_url``."""
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "out" / "r.jsonl"
    return invoke("collect", str(source), "-o", str(out), "--head-server", head_url, *extra)


def assert_refused(result: Any, tmp_path: Path, listener: socket.socket, *secrets: str) -> str:
    """Assert exit 2, one error line, no secret, nothing written or dispatched; return it."""
    assert result.exit_code == 2, (result.output, result.exception)
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, result.stderr
    assert "Traceback" not in result.output
    for secret in secrets:
        assert secret not in result.output
    assert not (tmp_path / "out").exists()
    assert connections(listener) == 0
    return errors[0]


# --- discovery works end to end ----------------------------------------------------------------


def test_collect_through_a_fake_serving_unresolved_interpolations(tmp_path: Path) -> None:
    """The fake (own process) serves ${...} like a real head server; collect runs to the end."""
    spec = DeploymentSpec(agents=(AgentSpec(name="math_agent"),))
    rows = [{**PROMPT, "task_source": "math_agent"}] * 3  # the instance declaring the dataset
    with spawn_fake_deployment(spec) as urls:
        result = collect(tmp_path, urls.head_url, rows, "--progress", "plain")
    assert result.exit_code == 0, (result.output, result.exception)
    landed = [json.loads(line) for line in (tmp_path / "out" / "r.jsonl").read_text().splitlines()]
    assert {row["agent_ref"]["name"] for row in landed} == {"math_agent"}
    assert len(landed) == 3
    assert FAKE_API_KEY not in result.output
    for path in (tmp_path / "out").iterdir():
        assert FAKE_API_KEY not in path.read_text(), path


# --- refused before anything is written or dispatched ---------------------------------------------


def test_collect_refuses_an_unresolvable_model_port_naming_the_key_only(
    tmp_path: Path, listener: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fake's model port reads an unset variable: exit 2 naming the path, no secret."""
    monkeypatch.delenv("TROLLOUT_TEST_UNSET_PORT", raising=False)
    port = listener.getsockname()[1]
    spec = DeploymentSpec(agents=(AgentSpec(name="math_agent"),))
    names = ("head_server", "policy_model", "math_agent_resources", "math_agent")
    cfg = build_config(spec, {**dict.fromkeys(names, port), "math_agent_environment_server": port})
    cfg["policy_model_port"] = "${oc.env:TROLLOUT_TEST_UNSET_PORT}"
    assert cfg["policy_api_key"] == FAKE_API_KEY  # read by ${policy_api_key} in the same block
    rows = [{**PROMPT, "agent_ref": {"name": "math_agent"}}]
    with serve_head_config(served(cfg)) as url:
        result = collect(tmp_path, url, rows)
    error = assert_refused(result, tmp_path, listener, FAKE_API_KEY, FAKE_API_KEY[3:12])
    assert error == (
        "trollout: error: deployment config key 'policy_model.responses_api_models.vllm_model."
        "port' cannot be resolved: it reads environment variable 'TROLLOUT_TEST_UNSET_PORT' of "
        "trollout's own environment, and a served config may read only the variables you allow; "
        "allow it with --allow-env TROLLOUT_TEST_UNSET_PORT (+served_config_env_allow="
        "[TROLLOUT_TEST_UNSET_PORT]) if the head server may read it, or give the interpolation a "
        "default"
    )


TASK = {"task_id": {"taskset": "weather", "task_id": "sf-1"}, "task_input": {"city": "SF"}}
FLAT = {**PROMPT, "agent_ref": {"name": AGENT}}


def pin_conflict(cfg: dict[str, Any]) -> None:
    """Make the resources server's datasets pin two agents."""
    block = cfg[RS]["resources_servers"][RS]
    block["datasets"] = [{"name": "a", "agent": AGENT}, {"name": "b", "agent": "other_agent"}]


def strict_verifier(cfg: dict[str, Any]) -> None:
    """Make the resources server accept only another agent type."""
    cfg[RS]["resources_servers"][RS]["allowed_agents"] = ["other_harness"]


def unchanged(cfg: dict[str, Any]) -> None:
    """Leave the fixture as it is."""


NEW_PATHS = {
    "taskset without a route": (
        unchanged,
        [TASK],
        (),
        "task rows of taskset 'weather' have no route in environment_server_routes; pass "
        "+environment_server_routes={weather:<environment server>}",
    ),
    "route to an unknown server": (
        unchanged,
        [TASK],
        ("+environment_server_routes={weather:weather_env}",),
        "environment_server_routes.weather: unknown environment server 'weather_env' (known: "
        f"'{ENV}'); fix _ng_environment_server in the rows or the environment server settings",
    ),
    "taskset mode with flat rows": (
        unchanged,
        [TASK, FLAT, FLAT],
        ("+environment_routing_mode=taskset", f"+environment_server_routes={{weather:{ENV}}}"),
        "2 rows, first at {input}:2: flat rows (no task_id), but environment_routing_mode is "
        "'taskset'; convert them to task rows, or pass +environment_routing_mode=agent",
    ),
    "taskset mode without routes": (
        unchanged,
        [TASK],
        ("+environment_routing_mode=taskset",),
        "environment_routing_mode 'taskset' needs environment_server_routes",
    ),
    "conflicting agent pins": (
        pin_conflict,
        [{**PROMPT, "task_source": RS}],
        (),
        "{input}:1: "
        f"task_source '{RS}': its datasets pin conflicting agents ('{AGENT}', "
        f"'other_agent'), which task_source alone cannot tell apart; pass +agent_map={{{RS}:"
        "<agent>} to pick one",
    ),
    "unknown task_source instance": (
        unchanged,
        [{**PROMPT, "task_source": "example"}],  # a dataset's name, not an instance
        (),
        "{input}:1: "
        f"unknown task_source instance 'example' (known: '{RS}', '{AGENT}'); name "
        "the agent or resources server whose config declares the rows' dataset, or set "
        "agent_ref.name on the rows",
    ),
    "refused pairing": (
        strict_verifier,
        [{**PROMPT, "task_source": RS}],
        (),
        "{input}:1: "
        f"agent '{AGENT}' (from task_source '{RS}') is not admitted: agent "
        f"'{AGENT}' runs 'simple_agent', but the resources server it runs against '{RS}' accepts "
        "only "
        "'other_harness'; route these rows to an agent of an accepted type",
    ),
}


@pytest.mark.parametrize("case", list(NEW_PATHS))
def test_collect_refuses_bad_input_on_the_routing_paths(
    case: str, tmp_path: Path, listener: socket.socket
) -> None:
    """Each new refusal: one line naming the problem, exit 2, nothing written or dispatched."""
    edit, rows, extra, expected = NEW_PATHS[case]
    cfg = fixture_config(listener.getsockname()[1])
    edit(cfg)
    with serve_head_config(served(cfg)) as url:
        result = collect(tmp_path, url, rows, *extra)
    error = assert_refused(result, tmp_path, listener, FIXTURE_SECRET)
    assert expected.replace("{input}", str(tmp_path / "in.jsonl")) in error
