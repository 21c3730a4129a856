"""The OTLP exporters' HTTP session: every receiver reply read up to `MAX_TELEMETRY_REPLY_BYTES`.

OpenTelemetry's OTLP/HTTP exporters send through a ``requests.Session`` without ``stream=True``,
so requests reads each reply whole before the exporter looks at its status: a receiver that
answers 2 GB takes the collector's memory with it (3.5 GB RSS measured). The exporters take a
``session=`` (their public parameter); `otlp_session` gives them one whose adapter reads every
reply as a stream and stops past the bound. An OTLP reply is a small protobuf or JSON message
(an empty success, or a partial-success count and text), so 1 MiB is far above any honest one.

A reply past the bound raises `TelemetryReplyTooLargeError`, a ``requests`` error that is not a
connection error: the exporter gives up on that batch (no retry) and logs one line, which
runtime.py's filter shows once per run as ``trollout: telemetry: Failed to export ...`` naming
the URL (without credentials) and the bound. The connection is closed, not drained. Telemetry
never fails a rollout, so this is all that happens.

A session from OpenTelemetry's credential provider (``OTEL_PYTHON_EXPORTER_OTLP_HTTP_*
CREDENTIAL_PROVIDER``) is used as the exporter would have used it, with the bounded adapter
mounted on it: passing ``session=`` must not drop a user's credentials.

Rejected alternatives: a custom ``_transport`` for the exporter (a private parameter, and the
whole exporter HTTP layer to re-implement); a ``Session.send`` override (it would not apply to
a credential provider's session); a response hook (requests runs hooks after the body is read).
The adapter sets ``Response._content``, the attribute requests itself fills when it reads a body
(test doubles such as ``responses`` do the same), so the exporter and any other reader of
``response.content`` see the body as usual.
"""

from __future__ import annotations

from typing import Any, Final

import requests
from opentelemetry.exporter.otlp.proto.http import _common as otlp_common
from requests.adapters import HTTPAdapter

from ..text import public_url

__all__ = ["MAX_TELEMETRY_REPLY_BYTES", "TelemetryReplyTooLargeError", "otlp_session"]

MAX_TELEMETRY_REPLY_BYTES: Final = 1024 * 1024
"""The longest OTLP receiver reply read (an honest one is a few bytes to a few KB)."""
TRACES_CREDENTIAL_VAR: Final = "OTEL_PYTHON_EXPORTER_OTLP_HTTP_TRACES_CREDENTIAL_PROVIDER"
METRICS_CREDENTIAL_VAR: Final = "OTEL_PYTHON_EXPORTER_OTLP_HTTP_METRICS_CREDENTIAL_PROVIDER"
_CHUNK_BYTES: Final = 65536


class TelemetryReplyTooLargeError(requests.exceptions.RequestException):
    """An OTLP receiver's reply is longer than `MAX_TELEMETRY_REPLY_BYTES`."""


class BoundedAdapter(HTTPAdapter):
    """An HTTP adapter that reads each reply body up to `limit` bytes (decoded), then stops.

    Args:
        limit: the longest body read.
    """

    def __init__(self, limit: int = MAX_TELEMETRY_REPLY_BYTES) -> None:
        super().__init__()
        self.limit = limit

    def send(  # type: ignore[override]  # requests' own signature, loosely typed
        self, request: requests.PreparedRequest, stream: bool = False, **kwargs: Any
    ) -> requests.Response:
        """Send `request`; return its response with the body read (`stream` is ignored).

        Raises:
            TelemetryReplyTooLargeError: the body is longer than `limit` (its connection closed).
            requests.RequestException: as `HTTPAdapter.send`.
        """
        response = super().send(request, stream=True, **kwargs)
        body = bytearray()
        try:
            for chunk in response.iter_content(_CHUNK_BYTES):
                body += chunk
                if len(body) > self.limit:
                    raise TelemetryReplyTooLargeError(
                        f"the reply to {request.method} {public_url(str(request.url))} is "
                        f"larger than {self.limit} bytes (MAX_TELEMETRY_REPLY_BYTES), so it was "
                        "not read"
                    )
        except BaseException:
            response.close()  # not consumed: closes the connection rather than reading on
            raise
        response._content = bytes(body)
        response._content_consumed = True
        response.close()  # consumed: the connection goes back to the pool
        return response


def otlp_session(credential_var: str, limit: int = MAX_TELEMETRY_REPLY_BYTES) -> requests.Session:
    """Return the session an OTLP/HTTP exporter should use: replies bounded by `limit`.

    Args:
        credential_var: the signal's credential-provider variable (`TRACES_CREDENTIAL_VAR`,
            `METRICS_CREDENTIAL_VAR`); when it, or the variable for all signals, names a
            provider, its session is the one returned.
        limit: the longest reply body read.
    """
    # The exporter's own loader of a provider's session (None when no provider is named).
    load = getattr(otlp_common, "_load_session_from_envvar", None)
    session = (load(credential_var) if load is not None else None) or requests.Session()
    adapter = BoundedAdapter(limit)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session
