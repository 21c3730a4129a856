"""The rule the four enrichment settings obey together, in one place.

`RunConfig.validate` refuses a run whose enrichment settings contradict each other, and
`trollout.enrichment.EnrichmentOptions` (an embedding driver's way in, without a `RunConfig`)
refuses the same; both call `enrichment_problem`, so the rule and its messages have one
definition. It lives here because settings is a leaf package that every layer may import,
enrichment included; enrichment (below the engine) is not importable from settings.

Rejected: the rule in `trollout.enrichment` with `RunConfig` importing it (settings would no
longer be a leaf), and a copy in each (the two drifted: one tested ``startswith("/")``, the
other `os.path.isabs`).
"""

from __future__ import annotations

import os

__all__ = ["enrichment_problem"]


def enrichment_problem(
    observability: bool, capture_dir: str | None, include_payloads: bool, delete_capture: bool
) -> str | None:
    """Return what is wrong with the four enrichment settings together, or None.

    Args:
        observability: ``observability_enabled``.
        capture_dir: ``model_call_capture_dir`` (absolute; required with observability).
        include_payloads: ``include_model_call_payloads``.
        delete_capture: ``delete_model_call_capture`` (needs the payloads kept).
    """
    if observability and not capture_dir:
        return (
            "model_call_capture_dir is required when observability_enabled=true; pass "
            "+model_call_capture_dir=/absolute/dir (the model servers' capture dir)"
        )
    if observability and capture_dir and not os.path.isabs(capture_dir):
        return (
            f"model_call_capture_dir must be an absolute path (got {capture_dir!r}); pass the "
            "dir the model servers write, as an absolute path"
        )
    if delete_capture and not include_payloads:
        return (
            "delete_model_call_capture=true needs include_model_call_payloads=true: a deleted "
            "capture file's request/response bodies would be lost; drop one of the two"
        )
    return None
