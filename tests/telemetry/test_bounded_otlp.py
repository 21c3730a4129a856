"""An OTLP receiver that answers without end: trollout reads at most MAX_TELEMETRY_REPLY_BYTES.

OpenTelemetry's exporters read replies whole through requests; otlp_session.py gives them a
session that stops at the bound. The receiver (endless_reply.py) streams 64 MiB per reply and
records whether the client left before the end, so the tests see the read stop, not just an
error.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import requests

from builders import invoke, read_jsonl, write_tasks_input
from endless_reply import endless_reply_server
from trollout.telemetry.otlp_session import (
    MAX_TELEMETRY_REPLY_BYTES,
    TRACES_CREDENTIAL_VAR,
    TelemetryReplyTooLargeError,
    otlp_session,
)
from trollout.testing import FakeUrls

MIB = 1024 * 1024
TOTAL = 64 * MIB


def test_otlp_session_stops_reading_at_its_bound() -> None:
    """A reply past the bound raises one line naming the URL and the bound; the connection is
    closed before the receiver has sent a quarter of its reply."""
    with endless_reply_server(TOTAL) as (url, replies):
        with requests.Session() as plain, otlp_session(TRACES_CREDENTIAL_VAR) as session:
            assert type(session) is type(plain)
            with pytest.raises(TelemetryReplyTooLargeError) as caught:
                session.post(f"{url}/v1/traces?k=s3cret", data=b"\x00", timeout=30)
        [(sent, left)] = replies.wait_for_replies(1)
    assert left
    assert sent < TOTAL // 4, sent
    assert str(caught.value) == (
        f"the reply to POST {url}/v1/traces is larger than {MAX_TELEMETRY_REPLY_BYTES} bytes "
        "(MAX_TELEMETRY_REPLY_BYTES), so it was not read"
    )


def test_otlp_session_reads_a_reply_within_its_bound() -> None:
    """A reply within the bound is read whole, as requests would, and the connection reused."""
    with endless_reply_server(3 * 65536) as (url, replies):
        with otlp_session(TRACES_CREDENTIAL_VAR) as session:
            first = session.post(f"{url}/v1/traces", data=b"\x00", timeout=30)
            second = session.post(f"{url}/v1/traces", data=b"\x00", timeout=30)
        assert replies.wait_for_replies(2) == [(3 * 65536, False)] * 2
    assert first.status_code == second.status_code == 200
    assert len(first.content) == 3 * 65536 + 2


def test_collect_with_an_endless_otlp_receiver(
    tmp_path: Path, fake: FakeUrls, caplog: pytest.LogCaptureFixture
) -> None:
    """`trollout collect --otlp-endpoint` against a receiver answering 64 MiB: exit 0, every
    row as usual, one telemetry line naming the bound, and every reply cut short."""
    source = write_tasks_input(tmp_path / "tasks.jsonl", 4)
    with endless_reply_server(TOTAL) as (url, replies), caplog.at_level(logging.WARNING):
        result = invoke(
            "collect",
            str(source),
            "-o",
            str(tmp_path / "run" / "r.jsonl"),
            *("--head-server", fake.head_url, "--agent", "math_agent"),
            *("--progress", "plain", "--no-aggregate", "--otlp-endpoint", url),
            env={"OTEL_EXPORTER_OTLP_TIMEOUT": "30", "OTEL_METRIC_EXPORT_INTERVAL": "600000"},
        )
        ended = replies.wait_for_replies(len(replies.paths))
    assert result.exit_code == 0, (result.output, result.exception)
    assert len(read_jsonl(tmp_path / "run" / "r.jsonl")) == 4
    assert ended
    assert all(left and sent < TOTAL // 4 for sent, left in ended), ended
    shown = [r for r in caplog.records if r.name.startswith(("opentelemetry", "trollout.tele"))]
    assert len(shown) == 1
    message = shown[0].getMessage()
    assert "MAX_TELEMETRY_REPLY_BYTES" in message
    assert f"larger than {MAX_TELEMETRY_REPLY_BYTES} bytes" in message
    assert "\n" not in message
