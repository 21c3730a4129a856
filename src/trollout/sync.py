"""The blocking front end of trollout: ``trollout.sync.open_rollouts`` (see `frontends.sync`)."""

from __future__ import annotations

from .frontends.sync import SyncBatch, SyncRollouts, open_rollouts

__all__ = ["SyncBatch", "SyncRollouts", "open_rollouts"]
