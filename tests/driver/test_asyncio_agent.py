"""An asyncio agent run in-process as a Trio collector's transport (trio-asyncio)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from builders import HANG_GUARD_S

CHECK = Path(__file__).with_name("asyncio_agent_check.py")


def test_asyncio_agents_serve_rollouts_fail_typed_and_are_cancelled() -> None:
    """Rollouts land from an asyncio agent, its exception fails one typed, a close cancels it.

    Run in a subprocess: importing trio-asyncio patches asyncio for the whole process.
    """
    done = subprocess.run(
        [sys.executable, str(CHECK)],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "ok"


def test_importing_trollout_does_not_import_trio_asyncio() -> None:
    """trio-asyncio patches asyncio when imported; `import trollout` must never do that."""
    code = "import sys, trollout, trollout.aio, trollout.sync; print('trio_asyncio' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
