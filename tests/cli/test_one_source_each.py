"""Two sources for one setting are an error unless the docs say which wins (issue 22).

Each case runs ``trollout collect`` (or ``aggregate``) in process. The refusals come before the
deployment is asked or a file is written, so they point at an agent that is never reached
(127.0.0.1:9) and check: exit 2, one line naming both sources, nothing written. The precedence
docs/user-guide.md states (a higher source replaces a lower one's other spelling, with a note) runs
against the bundled fake deployment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from builders import invoke, read_jsonl, write_jsonl
from trollout.testing import AgentSpec, DeploymentSpec, FakeUrls

NOWHERE = "http://127.0.0.1:9"


def rows(n: int, agent: str = "alpha") -> list[dict[str, Any]]:
    """Return n questions routed to ``agent``."""
    return [
        {
            "responses_create_params": {"input": [{"role": "user", "content": f"{i} + 1?"}]},
            "agent_ref": {"name": agent},
        }
        for i in range(n)
    ]


def collect(tmp_path: Path, *args: str) -> Any:
    """Run ``trollout collect`` over three rows into tmp_path/out."""
    source = write_jsonl(tmp_path / "in.jsonl", rows(3))
    return invoke("collect", str(source), "--progress", "plain", *args)


def out(tmp_path: Path) -> str:
    """The output file (its folder must never appear when a run is refused)."""
    return str(tmp_path / "out" / "r.jsonl")


def refused(result: Any, *needles: str) -> str:
    """Exit 2, one line on stderr holding every needle, no traceback; return the line."""
    assert result.exit_code == 2, (result.output, result.exception)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return str(lines[0])


def test_a_num_repeats_key_naming_no_agent_is_refused(tmp_path: Path) -> None:
    """+num_repeats={agent_A:3}, a typo of no agent of the run: refused, not ignored."""
    result = collect(tmp_path, "-o", out(tmp_path), "--agent-url", f"alpha={NOWHERE}",
                     "+num_repeats={agent_A:3,alpha:2}")  # fmt: skip
    refused(result, "num_repeats.agent_A", "not an agent of the run (agents: alpha)")
    assert not (tmp_path / "out").exists()


def test_a_num_repeats_add_seed_key_naming_no_agent_is_refused(tmp_path: Path) -> None:
    """The other per-agent mapping is held to the same rule."""
    result = collect(tmp_path, "-o", out(tmp_path), "--agent-url", f"alpha={NOWHERE}",
                     "+num_repeats_add_seed={alhpa:true}")  # fmt: skip
    refused(result, "num_repeats_add_seed.alhpa", "agents: alpha")
    assert not (tmp_path / "out").exists()


def test_agent_and_agent_map_together_are_refused(tmp_path: Path) -> None:
    """--agent and +agent_map both decide which agent runs the rows: give one."""
    result = collect(tmp_path, "-o", out(tmp_path), "--agent-url", f"alpha={NOWHERE}",
                     "--agent", "alpha", "+agent_map={_default:alpha}")  # fmt: skip
    line = refused(result, "--agent and +agent_map both set which agent runs the rows")
    assert "give one" in line
    assert not (tmp_path / "out").exists()


def test_agent_url_and_head_server_together_are_refused(tmp_path: Path) -> None:
    """--agent-url and --head-server both say where the deployment is: which is it?"""
    result = collect(tmp_path, "-o", out(tmp_path), "--agent-url", f"alpha={NOWHERE}",
                     "--head-server", NOWHERE)  # fmt: skip
    refused(result, "--agent-url and --head-server both set where the deployment is")
    assert not (tmp_path / "out").exists()


def test_two_urls_for_one_agent_are_refused(tmp_path: Path) -> None:
    """--agent-url alpha=... twice: refused (the last no longer wins)."""
    result = collect(tmp_path, "-o", out(tmp_path), "--agent-url", f"alpha={NOWHERE}",
                     "--agent-url", "alpha=http://127.0.0.1:10")  # fmt: skip
    line = refused(result, "--agent-url names agent 'alpha' twice")
    assert "127.0.0.1" not in line  # URLs are not shown
    assert not (tmp_path / "out").exists()


def test_output_option_and_override_together_are_refused(tmp_path: Path) -> None:
    """-o and +output_jsonl_fpath: refused naming both; neither output is written."""
    other = tmp_path / "other" / "r.jsonl"
    result = collect(tmp_path, "-o", out(tmp_path), "--agent-url", f"alpha={NOWHERE}",
                     f"+output_jsonl_fpath={other}")  # fmt: skip
    refused(result, "output_jsonl_fpath is given twice on the command line",
            "-o/--output and +output_jsonl_fpath")  # fmt: skip
    assert not (tmp_path / "out").exists()
    assert not other.parent.exists()


def test_an_override_given_twice_is_refused(tmp_path: Path) -> None:
    """+num_repeats=2 +num_repeats=3: refused (Hydra refuses it too)."""
    result = collect(tmp_path, "-o", out(tmp_path), "--agent-url", f"alpha={NOWHERE}",
                     "+num_repeats=2", "+num_repeats=3")  # fmt: skip
    refused(result, "num_repeats is given twice on the command line (+num_repeats and")
    assert not (tmp_path / "out").exists()


def test_drain_margin_without_a_budget_is_refused(tmp_path: Path) -> None:
    """--drain-margin does nothing without --budget: refused naming both."""
    result = collect(tmp_path, "-o", out(tmp_path), "--agent-url", f"alpha={NOWHERE}",
                     "--drain-margin", "5")  # fmt: skip
    refused(result, "--drain-margin", "--budget (+dispatch_budget_s) is not set")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("how", ["--config", "+config_paths"])
def test_a_yaml_key_given_twice_is_refused_naming_file_line_and_key(
    tmp_path: Path, how: str
) -> None:
    """A settings file with num_repeats twice: refused, not the last value taken."""
    settings = tmp_path / "run.yaml"
    settings.write_text("num_repeats: 2\nlimit: 1\nnum_repeats: 3\n", encoding="utf-8")
    given = ["--config", str(settings)] if how == "--config" else [f"+config_paths=[{settings}]"]
    result = collect(tmp_path, "-o", out(tmp_path), "--agent-url", f"alpha={NOWHERE}", *given)
    refused(result, str(settings), "the key 'num_repeats' twice", "line 3")
    assert not (tmp_path / "out").exists()


def test_a_prompt_file_key_given_twice_is_refused(tmp_path: Path) -> None:
    """Any YAML trollout loads from the user: a prompt file with 'user' twice."""
    prompt = tmp_path / "prompt.yaml"
    prompt.write_text("user: 'first {q}'\nuser: 'second {q}'\n", encoding="utf-8")
    source = write_jsonl(tmp_path / "in.jsonl", [{"q": "1+1", "agent_ref": {"name": "alpha"}}])
    result = invoke("collect", str(source), "-o", out(tmp_path), "--agent-url",
                    f"alpha={NOWHERE}", f"+prompt_config={prompt}")  # fmt: skip
    refused(result, "prompt.yaml", "the key 'user' twice", "line 2")
    assert not (tmp_path / "out").exists()


def test_aggregate_output_option_and_override_together_are_refused(tmp_path: Path) -> None:
    """aggregate -o and +output_jsonl_fpath: the same rule as collect's."""
    shard = write_jsonl(tmp_path / "s.jsonl", [{"reward": 1.0}])
    result = invoke("aggregate", str(shard), "-o", out(tmp_path),
                    f"+output_jsonl_fpath={tmp_path / 'm.jsonl'}")  # fmt: skip
    refused(result, "output_jsonl_fpath is given twice", "-o/--output and +output_jsonl_fpath")
    assert not (tmp_path / "out").exists()
    assert not (tmp_path / "m.jsonl").exists()


@pytest.fixture(scope="module")
def fake_spec() -> DeploymentSpec:
    """Unlike the shared fake's: agents alpha and beta."""
    return DeploymentSpec(agents=(AgentSpec(name="alpha"), AgentSpec(name="beta")))


def test_the_command_line_replaces_a_files_other_spelling_with_a_note(
    tmp_path: Path, fake: FakeUrls
) -> None:
    """agent_map in --config, --agent on the command line: the user guide's precedence, noted."""
    settings = tmp_path / "run.yaml"
    settings.write_text("agent_map: {_default: alpha}\n", encoding="utf-8")
    result = collect(tmp_path, "-o", out(tmp_path), "--head-server", fake.head_url,
                     "--config", str(settings), "--agent", "beta")  # fmt: skip
    assert result.exit_code == 0, (result.output, result.exception)
    notes = [line for line in result.stderr.splitlines() if "note:" in line]
    assert notes == [
        f"trollout: note: --agent replaces agent_map from config file {str(settings)!r} (both "
        "set which agent runs the rows)"
    ]
    landed = read_jsonl(Path(out(tmp_path)))
    assert sorted(row["agent_ref"]["name"] for row in landed) == ["beta"] * 3
