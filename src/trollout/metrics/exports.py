"""NeMo Gym's exporter names: failure and retry counts, and the masking view.

What a NeMo Gym exporter reads, under the reference's names, computed from a resolved
`reader.Collection` (so from the files alone, across resumes and shards):

- `failure_exports` (``_failure_export_metrics``): ``coverage/failed/<class>`` counts the
  rollouts with no row, by the class of their latest attempt (an interrupted attempt is a
  rollout's latest execution but no failure, so an older failure's class is not counted);
  ``retries/attempts`` the failed attempts (rows of attempts that reached a server: trollout
  counts them as resume does, so a never-sent or omitted attempt is none);
  ``retries/rollouts_retried`` the rollouts dispatched more than once; ``retries/at_cap`` the
  rollouts with no row that used all their attempts, each held to the cap its collection
  recorded on its last attempt (``_ng_failure_max_attempts``) or the current cap;
  ``retries/max_attempts`` that cap, left out when rollouts were collected with different caps.
- `masking_view` (``_masking_step_metrics``): what a run is losing to its environment rather
  than its policy: ``progress/<agent>/masked_pct``, ``progress/<agent>/reward_unmasked`` (the
  mean reward of the unmasked rollouts, in percent), ``progress/<agent>/failed`` and
  ``progress/<agent>/omitted``; empty until something is masked or dropped, so a healthy run
  exports nothing new.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..recovery.layout import RunLayout
from .coverage import OMITTED, GroupKey
from .estimators import exact_sum
from .reader import Collection

__all__ = ["failure_exports", "group_exports", "masking_view", "run_exports"]


def failure_exports(collection: Collection, key: GroupKey | None, cap: int) -> dict[str, int]:
    """Return the failure and retry counts of one group (or of every group, for None)."""
    failed: Counter[str] = Counter()
    retried = at_cap = attempts = 0
    caps: set[int] = set()
    for (group, task, rollout), mark in collection.ledger.marks.items():
        if key is not None and group != key:
            continue
        spent = collection.ledger.attempts[group, task, rollout]
        attempts += spent
        landed = bool(collection.group(group).task(task).landed >> rollout & 1)
        retried += spent + landed > 1
        if mark.failure_class == OMITTED:
            continue
        own_cap = mark.max_attempts or cap
        caps.add(own_cap)
        if not landed:
            failed[mark.failure_class] += 1
            at_cap += spent >= own_cap
    out = {f"coverage/failed/{name}": n for name, n in sorted(failed.items())}
    out |= {"retries/attempts": attempts, "retries/rollouts_retried": retried}
    out["retries/at_cap"] = at_cap
    if len(caps) <= 1:
        out["retries/max_attempts"] = next(iter(caps), cap)
    return out


def masking_view(collection: Collection, key: GroupKey, label: str) -> dict[str, float]:
    """Return one group's masking view (empty when nothing is masked or dropped)."""
    states = collection.groups[key].tasks.values()
    masked = sum(s.masked for s in states)
    unmasked = sum(s.rows for s in states)
    coverage = collection.coverage[key]
    failed, omitted = sum(coverage.failed.values()), coverage.omitted
    if not (masked or failed or omitted):
        return {}
    out: dict[str, float] = {}
    if masked:
        out[f"progress/{label}/masked_pct"] = round(100 * masked / (masked + unmasked), 2)
    if unmasked:
        reward = exact_sum([v for s in states for v in s.values("reward")])
        out[f"progress/{label}/reward_unmasked"] = round(100 * reward / unmasked, 2)
    if failed:
        out[f"progress/{label}/failed"] = failed
    if omitted:
        out[f"progress/{label}/omitted"] = omitted
    return out


def group_exports(collection: Collection, key: GroupKey, label: str, cap: int) -> dict[str, Any]:
    """Return one group's exports: its failure and retry counts, then its masking view."""
    return failure_exports(collection, key, cap) | masking_view(collection, key, label)


def run_exports(layout: RunLayout, cap: int) -> dict[str, Any]:
    """Return a run folder's exports, from its files alone (``trollout status --json``).

    The failure and retry counts are the run's totals; the masking view is per group.
    """
    collection = Collection(None)
    collection.read([layout.output])
    collection.resolve(count_missing=False)
    out: dict[str, Any] = failure_exports(collection, None, cap)
    for key in sorted(collection.groups, key=lambda k: (k[0] or "", k[1] or "")):
        out |= masking_view(collection, key, key[0] or key[1] or "(no agent)")
    return out
