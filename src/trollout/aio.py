"""The asyncio front end of trollout: ``trollout.aio.open_rollouts`` (see `frontends.aio`)."""

from __future__ import annotations

from .frontends.aio import AioBatch, AioRollouts, open_rollouts

__all__ = ["AioBatch", "AioRollouts", "open_rollouts"]
