"""The error a server's refusal or failure of a generation becomes. The request and its responses are the wire's
(``trtllm_kit.wire``: ``GenerationRequest``, ``GenerationResponse``); the client (``serve/client.py``) sends and
reads them, the frontends build and read them."""

from __future__ import annotations

from trtllm_kit.errors import KitError


class GenerationError(KitError):
    """The server refused or failed a generation request."""

    def __init__(self, message: str, *, status: int = 500) -> None:
        super().__init__(message)
        self.status = status
