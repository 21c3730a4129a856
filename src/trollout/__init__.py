"""trollout: a rollout collector for LLM agents and RL environments, on Trio.

The public API lives here; everything else may change.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
