"""Traces: a ``job`` span for the run, and one trace per dispatched attempt.

Design note. As NeMo Gym 0.7.0's ``_dispatch_span`` does, each attempt is the root of its own
trace, *linked* to the job span rather than its child, so one trace holds one attempt (the
agent's and model server's spans join it through the ``traceparent`` header every POST of the
attempt carries) while the job keeps the run's own lifecycle; a job span would otherwise parent
thousands of rollouts and no trace viewer could open it. The job span's own parent is the
``TRACEPARENT`` (and ``TRACESTATE``) environment context, when one is set. Unlike NeMo Gym,
attempts stay roots under an embedder's trace too: one rule, bounded traces.

Spans end on the event loop's thread and are exported by a `BatchSpanProcessor` in its own
thread, so exporting never blocks a rollout; a failed export is logged once (`runtime`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from ..collector.dispatch.retry import public_url
from ..records import Failed, Landed, MaterializedRow

__all__ = ["ROLLOUT_REPEAT_ATTRIBUTE", "TASK_ID_ATTRIBUTE", "AttemptSpan", "Tracing"]

TASK_ID_ATTRIBUTE = "nemo.gym.task.id"  # NeMo Gym 0.7.0's names, so traces join across tools
ROLLOUT_REPEAT_ATTRIBUTE = "nemo.gym.rollout.repeat"
_EMPTY = otel_context.Context()  # no parent: each attempt starts its own trace


class AttemptSpan:
    """One attempt's span and the header lines that carry its context (`AttemptTrace`)."""

    __slots__ = ("headers", "span")

    def __init__(self, span: trace.Span, headers: bytes) -> None:
        self.span = span
        self.headers = headers


class Tracing:
    """The run's tracer: the job span and every attempt's span.

    Args:
        provider: the tracer provider (its processors export the spans).
        environ: where ``TRACEPARENT`` / ``TRACESTATE`` are read (the process environment).
    """

    def __init__(self, provider: TracerProvider, environ: Mapping[str, str] | None = None) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("trollout")
        env = os.environ if environ is None else environ
        carrier = {
            "traceparent": env.get("TRACEPARENT", ""),
            "tracestate": env.get("TRACESTATE", ""),
        }
        self.parent = propagate.extract(carrier) if carrier["traceparent"] else _EMPTY
        self.job: trace.Span | None = None
        self.links: list[Link] = []

    def start_job(self, attributes: Mapping[str, str | int]) -> None:
        """Open the run's ``job`` span (under ``TRACEPARENT``'s context, when set)."""
        self.job = self.tracer.start_span(
            "job", context=self.parent, kind=SpanKind.INTERNAL, attributes=dict(attributes)
        )
        self.links = [Link(self.job.get_span_context())]

    def end_job(self, attributes: Mapping[str, str | int | float]) -> None:
        """Close the job span with the run's final counts."""
        if self.job is not None:
            self.job.set_attributes(dict(attributes))
            self.job.end()
            self.job = None

    def start_attempt(self, row: MaterializedRow, attempt: int, url: str) -> AttemptSpan:
        """Open an attempt's span as a new trace's root, linked to the job."""
        identity = row.identity
        task_id = identity.task_id.get("task_id") if identity.task_id else None
        attributes: dict[str, str | int] = {
            TASK_ID_ATTRIBUTE: str(task_id if task_id is not None else identity.task_index),
            ROLLOUT_REPEAT_ATTRIBUTE: identity.rollout_index,
            "trollout.task.index": identity.task_index,
            "trollout.attempt": attempt,
            "trollout.url": public_url(url),  # never its user:password@ or ?query
        }
        if identity.agent_name is not None:
            attributes["trollout.agent"] = identity.agent_name
        if identity.environment_server is not None:
            attributes["trollout.environment_server"] = identity.environment_server
        span = self.tracer.start_span(
            "dispatch",
            context=_EMPTY,
            kind=SpanKind.CLIENT,
            links=self.links,
            attributes=attributes,
        )
        return AttemptSpan(span, _headers(span))

    def end_attempt(
        self, attempt: AttemptSpan, outcome: Landed | Failed | None, retries: int
    ) -> None:
        """Close an attempt's span with its outcome, failure class and retries."""
        span = attempt.span
        span.set_attribute("trollout.retries", retries)
        if outcome is None:
            span.set_attribute("trollout.outcome", "omitted")
        elif type(outcome) is Landed:
            span.set_attribute("trollout.outcome", "landed")
            if outcome.reward is not None:
                span.set_attribute("trollout.reward", outcome.reward)
        else:
            assert isinstance(outcome, Failed)
            span.set_attributes(
                {
                    "trollout.outcome": "failed",
                    "trollout.failure_class": outcome.failure_class,
                    "trollout.failure_kind": outcome.kind,
                    "trollout.terminal": outcome.terminal,
                    "trollout.delivery": outcome.delivery.value,
                }
            )
            if outcome.http_status is not None:
                span.set_attribute("http.response.status_code", outcome.http_status)
            span.set_status(Status(StatusCode.ERROR, outcome.kind))
        span.end()

    @staticmethod
    def retry_wait(attempt: AttemptSpan, reason: str, delay_s: float) -> None:
        """Note a wait before a re-send as an event on the attempt's span."""
        attempt.span.add_event(
            "retry_wait", {"trollout.reason": reason, "trollout.wait_s": delay_s}
        )


def _headers(span: trace.Span) -> bytes:
    """Return the request header lines carrying `span`'s context (W3C trace context).

    Formatted here rather than through ``propagate.inject`` (7 us per attempt against 1 us):
    the fields are hex numbers, and a non-empty ``tracestate`` was validated by `TraceState`.
    """
    context = span.get_span_context()
    head = b"traceparent: 00-%032x-%016x-%02x\r\n" % (
        context.trace_id,
        context.span_id,
        context.trace_flags,
    )
    state = context.trace_state
    return head + b"tracestate: %s\r\n" % state.to_header().encode("ascii") if state else head
