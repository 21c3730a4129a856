"""`trollout collect` with one ``--agent-url`` and rows naming no agent: they run on it."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from builders import read_jsonl
from trollout.cli.main import cli
from trollout.testing import FakeUrls

ROW = {
    "responses_create_params": {"input": [{"role": "user", "content": "What is 1 + 1?"}]},
    "expected_answer": "2",
}


def test_one_agent_url_needs_no_agent_name(fake: FakeUrls, tmp_path: Path) -> None:
    """No agent_ref in the rows, no +agent_name: every rollout lands on the one agent given."""
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({**ROW, "id": i}) + "\n" for i in range(3)))
    output = tmp_path / "out" / "r.jsonl"
    result = CliRunner().invoke(
        cli,
        [
            "collect",
            str(source),
            "-o",
            str(output),
            "--agent-url",
            f"math_agent={fake.run_urls['math_agent']}",
            "--progress",
            "plain",
        ],
    )
    assert result.exit_code == 0, result.output
    rows = read_jsonl(output)
    assert len(rows) == 3
    assert {row["agent_ref"]["name"] for row in rows} == {"math_agent"}
