"""The failure report a failed /run forwards in its headers (classify/reports.py)."""

from __future__ import annotations

from typing import Any

import orjson

import builders
from trollout.collector.classify.outcomes import outcome_from_response
from trollout.collector.classify.reports import reply_failure_kind
from trollout.collector.http.transport import RawResponse
from trollout.records import Failed


def report(*events: dict[str, Any], selected: str = "a") -> dict[str, Any]:
    return {"_ng_failure_id": selected, "_ng_failure_events": list(events)}


def test_the_kind_is_the_outermost_non_routing_failure_on_the_selected_chain() -> None:
    """Routing kinds are passed over; the first real cause names the kind."""
    chain = report(
        {"failure_id": "a", "kind": "agent_run_error", "caused_by": "b"},
        {"failure_id": "b", "kind": "collection_dispatch_failed", "caused_by": "c"},
        {"failure_id": "c", "kind": "credentials_rejected", "caused_by": "d"},
        {"failure_id": "d", "kind": "http_401"},
        {"failure_id": "x", "kind": "quota_exhausted"},
    )
    assert reply_failure_kind(chain) == "credentials_rejected"


def test_no_kind_without_a_chain_or_with_a_broken_one() -> None:
    """None without a report, with a cause missing from it or a loop, or only routing kinds."""
    assert reply_failure_kind({}) is None
    broken = report({"failure_id": "a", "kind": "agent_run_error", "caused_by": "gone"})
    assert reply_failure_kind(broken) is None
    loop = report(
        {"failure_id": "a", "kind": "agent_run_error", "caused_by": "b"},
        {"failure_id": "b", "kind": "agent_route_failed", "caused_by": "a"},
    )
    assert reply_failure_kind(loop) is None
    assert reply_failure_kind(report({"failure_id": "a", "kind": "agent_run_error"})) is None


def response(status: int, header: Any) -> RawResponse:
    value = header if isinstance(header, str) else orjson.dumps(header).decode()
    return RawResponse(
        status=status,
        headers=[(b"x-ng-failure-report", value.encode())],
        body=b'"boom"',
        url="http://127.0.0.1:1/run",
    )


def test_a_failed_run_takes_its_forwarded_kind_and_keeps_the_report() -> None:
    """A 500 forwarding a report: failure_kind is the report's kind, the row keeps the report;
    an unreadable header changes nothing (http_500)."""
    chain = report(
        {"failure_id": "a", "kind": "agent_run_error", "caused_by": "b"},
        {"failure_id": "b", "kind": "credentials_rejected"},
    )
    outcome = outcome_from_response(
        builders.identity(0), 0, response(500, chain), elapsed_seconds=0.1, max_attempts=3
    )
    assert isinstance(outcome, Failed)
    assert (outcome.failure_class, outcome.kind) == ("agent_run_error", "credentials_rejected")
    assert outcome.extra == chain
    for bad in ("{not json", {"_ng_failure_events": "x", "_ng_failure_id": "a"}):
        plain = outcome_from_response(
            builders.identity(0), 0, response(500, bad), elapsed_seconds=0.1, max_attempts=3
        )
        assert isinstance(plain, Failed)
        assert (plain.kind, dict(plain.extra)) == ("http_500", {})
