"""An asyncio agent run in-process as a Trio collector's transport (trio-asyncio)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from builders import HANG_GUARD_S

CHECK = Path(__file__).with_name("asyncio_agent_check.py")


def run_check(name: str) -> None:
    """Run one check of asyncio_agent_check.py in a subprocess (trio-asyncio patches asyncio
    for the whole process when imported)."""
    done = subprocess.run(
        [sys.executable, str(CHECK), name],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "ok"


def test_asyncio_agents_serve_rollouts_fail_typed_and_are_cancelled() -> None:
    """Rollouts land from an asyncio agent, its exception fails one typed, a close cancels it."""
    run_check("collect")


def test_an_agents_own_asyncio_cancellation_fails_only_its_rollout() -> None:
    """An agent letting asyncio.CancelledError escape (Trio did not cancel it) fails that
    rollout as a RuntimeError; the other rows land and the collector takes another batch."""
    run_check("self_cancel")


def test_trio_cancelling_an_asyncio_agent_still_raises_cancelled() -> None:
    """A Trio cancellation of the call reaches its cancel scope as trio.Cancelled (the agent's
    asyncio task is cancelled), not as the error an agent's own cancellation becomes."""
    run_check("trio_cancel")


def test_importing_trollout_does_not_import_trio_asyncio() -> None:
    """trio-asyncio patches asyncio when imported; `import trollout` must never do that."""
    code = "import sys, trollout, trollout.aio, trollout.sync; print('trio_asyncio' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
