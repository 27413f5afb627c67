"""An HTTP error as OpenAI sends it: a JSON ``{"error": {...}}`` body with its status, ``Retry-After`` on 429 and
503, and ``x-should-retry: false`` so the official ``openai`` client does not resend a request that will fail
again. No traceback or server path reaches a client."""

from __future__ import annotations

from typing import Any

from aiohttp import web

RETRY_AFTER_S = 1


class HTTPError(Exception):
    """A request answered with an error: its message, HTTP status, the request field it names (``param``), OpenAI's
    ``code`` and error ``type`` (``kind``).

    Arguments:
        message: one sentence naming the field or bound, the value found and what to do.
        status: the HTTP status (400 unless said).
        param: the request field at fault, when there is one.
        code: OpenAI's machine-readable code.
        kind: OpenAI's error type (``invalid_request_error``, ``server_error``, ``rate_limit_error``, ...).
    """

    def __init__(self, message: str, status: int = 400, *, param: str | None = None,
                 code: str | None = None, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}


def error_response(exc: HTTPError) -> web.Response:
    """``exc`` as OpenAI's error body with its status; 429 and 503 carry ``Retry-After``.

    Arguments:
        exc: the refused request.
    """
    headers = {"x-should-retry": "false"}
    if exc.status in (429, 503):
        headers["Retry-After"] = str(RETRY_AFTER_S)
    return web.json_response(exc.body(), status=exc.status, headers=headers)
