"""The failure report a failed ``/run`` forwards in its headers, and the kind it names.

A server that answers ``/run`` with an error status (an agent whose environment's provider
refused its credentials, say) may say why in the header ``X-NG-Failure-Report``: a JSON object
holding a FailureReport, the same keys an episode reply carries beside its outcome
(``_ng_failure_id``, ``_ng_failure_events``, ``_ng_failure_events_omitted``; validated and
bounded by `failure_report`, the one definition of a valid report, which episode replies use
too). Each event is an
object; ``failure_id`` names it, ``kind`` says what failed and ``caused_by`` names the event it
was caused by. ``_ng_failure_id`` selects the chain: its event, then its causes.

`reply_failure_kind` is the kind of the outermost failure on that chain that is not a routing
kind (`ROUTING_KINDS`: an agent or the collection passing a failure on, which says where it
failed, not why); None without a report, with a broken chain (a cause that is not in the
report, omitted or never sent, or a loop) or when every failure on it only routes. The failure
row takes that kind as its ``failure_kind`` (else ``http_<status>``, as before) and keeps the
report, so the run-level stops (`engine.stops`) read a provider's refusal from a failed
``/run`` as from a producer's failure row.

Rejected: stopping on the status alone. A 500 whose report says ``credentials_rejected`` is the
same refusal as a 401 from the provider itself; without the report, every such rollout would
spend its attempts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson

from ... import records
from ..http.transport import RawResponse

__all__ = [
    "MAX_REPORT_EVENTS",
    "REPORT_HEADER",
    "ROUTING_KINDS",
    "failure_report",
    "reply_failure_kind",
    "reply_failure_report",
]

MAX_REPORT_EVENTS: Final = 32
REPORT_KEYS: Final = (records.FAILURE_EVENTS, records.FAILURE_ID, records.FAILURE_EVENTS_OMITTED)

REPORT_HEADER: Final = "x-ng-failure-report"
ROUTING_KINDS: Final = frozenset(
    {
        "agent_route_failed",
        "collection_dispatch_failed",
        records.FailureClass.AGENT_RUN_ERROR.value,
        records.FailureClass.AGENT_REQUEST_FAILED.value,
        records.FailureClass.ENVIRONMENT_SERVER_FAILED.value,
    }
)


def failure_report(reply: Mapping[str, Any]) -> dict[str, Any]:
    """Return the FailureReport keys beside an episode outcome, or {} when none or invalid.

    A report is ``_ng_failure_id`` (a non-empty string), ``_ng_failure_events`` (a list of
    objects) and ``_ng_failure_events_omitted`` (an integer >= 0), at least one of the first two
    present; a null key counts as absent. One ill-typed key drops the whole report (it is one
    unit), and an invalid report changes nothing else. At most `MAX_REPORT_EVENTS` events are
    kept; the rest are added to ``_ng_failure_events_omitted``.
    """
    present = {key: reply[key] for key in REPORT_KEYS if reply.get(key) is not None}
    events = present.get(records.FAILURE_EVENTS)
    failure_id = present.get(records.FAILURE_ID)
    omitted = present.get(records.FAILURE_EVENTS_OMITTED, 0)
    valid = (
        (events is not None or failure_id is not None)
        and (
            events is None
            or (isinstance(events, list) and all(isinstance(e, dict) for e in events))
        )
        and (failure_id is None or (isinstance(failure_id, str) and failure_id != ""))
        and type(omitted) is int
        and omitted >= 0
    )
    if not valid:
        return {}
    if events is not None and len(events) > MAX_REPORT_EVENTS:
        present[records.FAILURE_EVENTS] = events[:MAX_REPORT_EVENTS]
        present[records.FAILURE_EVENTS_OMITTED] = omitted + len(events) - MAX_REPORT_EVENTS
    return present


def reply_failure_report(response: RawResponse) -> dict[str, Any]:
    """Return the valid FailureReport a reply's headers carry, or {} (none, or not valid)."""
    text = response.header(REPORT_HEADER)
    if text is None:
        return {}
    try:
        report = orjson.loads(text)
    except orjson.JSONDecodeError:
        return {}
    return failure_report(report) if isinstance(report, dict) else {}


def reply_failure_kind(report: Mapping[str, Any]) -> str | None:
    """Return the kind of the outermost non-routing failure on the report's chain, or None."""
    events = report.get(records.FAILURE_EVENTS)
    selected = report.get(records.FAILURE_ID)
    if not isinstance(events, list) or not isinstance(selected, str):
        return None
    by_id = {e.get("failure_id"): e for e in events if isinstance(e.get("failure_id"), str)}
    seen: set[str] = set()
    current: Any = selected
    while isinstance(current, str) and current not in seen:
        seen.add(current)
        event = by_id.get(current)
        if event is None:
            return None  # a broken chain: its cause is not in the report
        kind = event.get("kind")
        if isinstance(kind, str) and kind and kind not in ROUTING_KINDS:
            return kind
        current = event.get("caused_by")
    return None
