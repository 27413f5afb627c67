"""What a request carries between the middlewares and the handlers, and the paths served without a key.

The gateway sets ``CALLER`` (the request's key) and ``ADMIT`` (the hook that reserves the request's most tokens or
refuses it); the handler sets ``ROUTE_NAME`` (the served model it resolved) and ``USAGE`` (its token counts, read
when the request ends, however it ends)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from aiohttp import web

METRICS_PATH = "/metrics"  # served without a key (per-key series for an admin key)
OPEN_PATHS = ("/health", "/version")  # served without a key, as vLLM and trtllm-serve serve them


class Caller(Protocol):
    """The key a request came with, as the handlers see it."""

    @property
    def name(self) -> str: ...

    @property
    def admin(self) -> bool: ...


Usage = Callable[[], dict[str, int]]  # prompt_tokens, completion_tokens, total_tokens so far
ADMIT: web.RequestKey[Callable[[int], None]] = web.RequestKey("gateway_admit")
CALLER: web.RequestKey[Caller] = web.RequestKey("gateway_key")
ROUTE_NAME: web.RequestKey[str] = web.RequestKey("route_name")
USAGE: web.RequestKey[Usage] = web.RequestKey("usage")


class Guard(Protocol):
    """A middleware in front of the handlers that admits requests by key (the gateway), with its start and stop and
    the series it adds to ``/metrics``."""

    async def middleware(self, request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse: ...

    async def on_startup(self, app: web.Application) -> None: ...

    async def on_cleanup(self, app: web.Application) -> None: ...

    def per_key_metrics(self, request: web.Request) -> bytes: ...
