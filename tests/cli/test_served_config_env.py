"""A head server cannot read the collector's environment, nor spin it forever (issue 22).

A served config is written by whoever runs the head server. ``${oc.env:NAME}`` in it reads only
the variables the user allows (``--allow-env`` / ``+served_config_env_allow``); an allowed value
is used to connect and never shown: every message, file and report shows the interpolation text.
Resolving one value is bounded, so an exponential chain of interpolations is refused at once.

Each test serves the config from a real loopback head server and runs the real CLI; the secret
is a distinctive spelling of 127.0.0.1 (``2130706433``, which the resolver accepts), so an
allowed host reaches the fake deployment without any name lookup leaving the machine.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from builders import connections, invoke, read_jsonl, serve_head_config
from trollout.testing import FakeUrls

SECRET = "2130706433"  # 127.0.0.1 as one decimal number: distinctive, and it connects
SHOWN = "${oc.env:TROLLOUT_TEST_SECRET_HOST}"
PROMPT = {"responses_create_params": {"input": [{"role": "user", "content": "What is 2 + 2?"}]}}


class _NoAliasDumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def served(cfg: dict[str, Any]) -> str:
    """Return ``cfg`` as the YAML text a head server serves."""
    return yaml.dump(cfg, Dumper=_NoAliasDumper, sort_keys=False)


def server_blocks(cfg: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Yield every server block of a served config (the head server's own is not one)."""
    for value in cfg.values():
        if isinstance(value, dict) and len(value) == 1:
            [impls] = value.values()
            if isinstance(impls, dict) and len(impls) == 1:
                [block] = impls.values()
                if isinstance(block, dict) and "port" in block:
                    yield block


@pytest.fixture(scope="module")
def fake_served_config(fake: FakeUrls) -> tuple[str, dict[str, Any]]:
    """The shared `fake`'s head URL and its served config, parsed."""
    text = httpx.get(fake.head_url + "/global_config_dict_yaml").json()
    return fake.head_url, yaml.safe_load(text)


def with_hosts(cfg: dict[str, Any], host: str) -> dict[str, Any]:
    """Return a copy of ``cfg`` whose every server block has ``host``."""
    out: dict[str, Any] = json.loads(json.dumps(cfg))
    for block in server_blocks(out):
        block["host"] = host
    return out


def collect(tmp_path: Path, head_url: str, *extra: str, secret: str = SECRET) -> Any:
    """Run ``trollout collect`` on three rows with the secret in the environment."""
    source = tmp_path / "in.jsonl"
    source.write_text(
        "".join(json.dumps({**PROMPT, "task_source": "math_agent"}) + "\n" for _ in range(3))
    )
    out = tmp_path / "out" / "r.jsonl"
    args = [
        "collect",
        str(source),
        "-o",
        str(out),
        "--head-server",
        head_url,
        "--progress",
        "plain",
    ]
    return invoke(*args, *extra, env={"TROLLOUT_TEST_SECRET_HOST": secret})


def assert_nowhere(secret: str, result: Any, folder: Path) -> None:
    """The secret is in no output and no file of the run folder (the report included)."""
    assert secret not in result.stdout
    assert secret not in result.stderr
    for path in folder.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


def test_an_environment_variable_not_allowed_is_refused_naming_key_and_setting(
    tmp_path: Path, fake_served_config: tuple[str, dict[str, Any]], listener: socket.socket
) -> None:
    """Default: no variable is allowed; ${oc.env:X} is one line naming the key and the fix."""
    cfg = with_hosts(fake_served_config[1], SHOWN)
    with serve_head_config(served(cfg)) as head:
        result = collect(tmp_path, head)
    assert result.exit_code == 2, result.output
    [error] = [line for line in result.stderr.splitlines() if line.strip()]
    assert "deployment config key '" in error
    assert (
        ".host' cannot be resolved: it reads environment variable 'TROLLOUT_TEST_SECRET_HOST'"
        in error
    )
    assert "--allow-env TROLLOUT_TEST_SECRET_HOST" in error
    assert "+served_config_env_allow=[TROLLOUT_TEST_SECRET_HOST]" in error
    assert_nowhere(SECRET, result, tmp_path)
    assert not (tmp_path / "out").exists()
    assert connections(listener) == 0


def test_a_default_is_taken_when_the_variable_is_not_allowed(
    tmp_path: Path, fake_served_config: tuple[str, dict[str, Any]]
) -> None:
    """${oc.env:X,default} with X set but not allowed reads as unset: the default is used."""
    secret = "sk@SECRET-4f1c9a7e2b"  # an API key: as a host it would be refused, not used
    cfg = with_hosts(fake_served_config[1], "${oc.env:TROLLOUT_TEST_SECRET_HOST,127.0.0.1}")
    with serve_head_config(served(cfg)) as head:
        result = collect(tmp_path, head, secret=secret)
    assert result.exit_code == 0, result.output
    assert len(read_jsonl(tmp_path / "out" / "r.jsonl")) == 3
    assert_nowhere(secret, result, tmp_path)


def test_an_allowed_variable_resolves_and_its_value_is_never_shown(
    tmp_path: Path, fake_served_config: tuple[str, dict[str, Any]]
) -> None:
    """--allow-env: the run reaches the servers through the value, and nothing shows it."""
    cfg = with_hosts(fake_served_config[1], SHOWN)
    with serve_head_config(served(cfg)) as head:
        result = collect(tmp_path, head, "--allow-env", "TROLLOUT_TEST_SECRET_HOST")
    assert result.exit_code == 0, result.output
    assert len(read_jsonl(tmp_path / "out" / "r.jsonl")) == 3
    assert (tmp_path / "out" / "r_report.html").is_file()
    assert_nowhere(SECRET, result, tmp_path)


def test_an_allowed_value_in_a_failure_is_shown_as_its_interpolation(
    tmp_path: Path, fake_served_config: tuple[str, dict[str, Any]]
) -> None:
    """Servers that refuse connections: every failure names ${oc.env:...}, never the value."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connecting is refused
    cfg = with_hosts(fake_served_config[1], SHOWN)
    for block in server_blocks(cfg):
        block["port"] = closed.getsockname()[1]
    try:
        with serve_head_config(served(cfg)) as head:
            result = collect(
                tmp_path,
                head,
                "+retry_backoff_base_s=0",
                "+dispatch_connect_grace_s=0",
                "+on_endpoint_outage=fail",
                "+served_config_env_allow=[TROLLOUT_TEST_SECRET_HOST]",
            )
    finally:
        closed.close()
    assert result.exit_code != 0, result.output
    failures = (tmp_path / "out" / "r_failures.jsonl").read_text()
    assert f"cannot connect to http://{SHOWN}:" in failures
    assert SHOWN in (tmp_path / "out" / "r_aggregate_metrics.json").read_text()
    assert_nowhere(SECRET, result, tmp_path)


def test_an_exponential_interpolation_chain_is_refused_by_key_path(
    tmp_path: Path, listener: socket.socket
) -> None:
    """x1: ${x0}${x0} ... x40: the host's resolution is refused at the bound, in one line."""
    port = listener.getsockname()[1]
    chain = {"x0": "a", **{f"x{i}": f"${{x{i - 1}}}${{x{i - 1}}}" for i in range(1, 41)}}
    block = {"host": "${x40}", "port": port}
    cfg = {**chain, "math_agent": {"responses_api_agents": {"simple_agent": block}}}
    with serve_head_config(served(cfg)) as head:
        result = collect(tmp_path, head, "--agent", "math_agent")
    assert result.exit_code == 2, result.output
    [error] = [line for line in result.stderr.splitlines() if line.strip()]
    assert error.startswith(
        "trollout: error: deployment config key 'math_agent.responses_api_agents.simple_agent."
        "host' cannot be resolved: it takes more than 1,000 interpolation steps"
    )
    assert not (tmp_path / "out").exists()
    assert connections(listener) == 0
