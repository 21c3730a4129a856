"""What every ``trollout`` command pays before it starts: the modules it imports."""

from __future__ import annotations

import subprocess
import sys


def test_cli_start_up_does_not_import_the_fake_deployment() -> None:
    """Only ``trollout demo`` needs `trollout.testing`; the CLI imports it when the demo runs."""
    code = (
        "import sys, trollout.cli.main\n"
        "print(sorted(m for m in sys.modules if m.startswith('trollout.testing')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
