"""The kit's OpenAI frontend and gateway in front of ``serve --dynamo``: the serve's only public port.

Dynamo's frontend binds a loopback port of the serve's private network namespace; the kit's frontend
(``serve/frontend.py``: the OpenAI routes, and the gateway of ``--api-keys``) runs on the OpenAI port in the serve's
process, outside the namespace, parses and checks each request as a plain serve does (keys, limits, quotas, usage,
the served name) and streams it from Dynamo's frontend (``frontend_client.py``) over sockets made in that namespace.
Its one route tokenizes with the artifact's tokenizer, so text and chat prompts reach Dynamo as the token ids a
plain serve would run.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from trtllm_kit.errors import KitError, KitUsageError
from trtllm_kit.serve.dynamo.frontend_client import DynamoFrontendClient, SocketFactory
from trtllm_kit.serve.dynamo.metrics import worker_metrics_urls
from trtllm_kit.serve.dynamo.worker_series import merged
from trtllm_kit.serve.frontend import OpenAIFrontend, start_frontend
from trtllm_kit.serve.openai.artifact_route import artifact_route, route_config
from trtllm_kit.serve.openai.config import OpenAIConfig
from trtllm_kit.serve.openai.metrics import CONTENT_TYPE
from trtllm_kit.serve.options import ServeOptions

DYNAMO_MODEL = "dynamo"  # the route's one model: Dynamo's frontend, which takes token ids
FRONTEND_CLOSE_S = 0.5  # the kit's frontend's streams end as Dynamo's processes do


class DynamoFrontend(OpenAIFrontend):
    """The kit's OpenAI frontend whose route streams from Dynamo's frontend.

    Arguments:
        config: the served model and the gateway's files; dynamo_url: ``http://host:port`` of Dynamo's frontend;
        socket_factory: makes the sockets that reach it (the serve's private namespace's);
        dynamo_root: the serve's ``RUN_DIR/dynamo``, whose ready files name the workers' ``/metrics``.
    """

    def __init__(self, config: OpenAIConfig, dynamo_url: str, socket_factory: SocketFactory | None = None,
                 dynamo_root: Path | None = None) -> None:
        super().__init__(config)
        self.dynamo_url = dynamo_url
        self.socket_factory = socket_factory
        self.dynamo_root = dynamo_root

    async def _open(self, _app: web.Application) -> None:
        for route in self.table.routes.values():
            route.client = DynamoFrontendClient(self.dynamo_url, route.name, self.socket_factory)

    async def prometheus_metrics(self, request: web.Request) -> web.Response:
        """The kit's frontend's series, Dynamo's frontend's (its router's, read through the private port) and every
        worker's, labelled by worker (``worker_series.py``)."""
        ours = await super().prometheus_metrics(request)
        assert isinstance(ours.body, bytes)
        clients = [r.client for r in self.table.routes.values() if isinstance(r.client, DynamoFrontendClient)]
        if not clients:
            return ours
        client = clients[0]
        urls = self._worker_urls()
        theirs, *read = await asyncio.gather(client.metrics(), *(client.scrape(url) for url in urls.values()))
        workers = {name: None if text is None else text.decode() for name, text in zip(urls, read, strict=True)}
        body = merged([ours.body.decode(), (theirs or b"").decode()], workers)
        return web.Response(body=body.encode(), headers={"Content-Type": CONTENT_TYPE})

    def _worker_urls(self) -> dict[str, str]:
        """``worker-N → its /metrics URL``, from the workers that have written their ready file."""
        if self.dynamo_root is None:
            return {}
        try:
            return worker_metrics_urls(self.dynamo_root)
        except KitUsageError:  # none is ready yet
            return {}


def dynamo_frontend(options: ServeOptions, name: str, dynamo_url: str,
                    socket_factory: SocketFactory | None = None, dynamo_root: Path | None = None) -> DynamoFrontend:
    """The kit's frontend of a ``--dynamo`` serve: OUT's route (Dynamo's frontend serves it under the same name),
    the serve's key or key file and usage log.

    Arguments:
        options: the serve; name: the served name; dynamo_url: where Dynamo's frontend listens;
        socket_factory: makes the sockets that reach it; dynamo_root: the serve's ``RUN_DIR/dynamo``.
    """
    settings = options.settings
    config = route_config(artifact_route(options.out, name, DYNAMO_MODEL), dynamo_url, api_key=options.api_key,
                          api_keys=settings.api_keys, usage_log=settings.usage_log)
    return DynamoFrontend(config, dynamo_url, socket_factory, dynamo_root)


async def serve_in_front(frontend: OpenAIFrontend, host: str, port: int, serving: Callable[[], Awaitable[None]],
                         stopping: Callable[[], None]) -> None:
    """Serve ``frontend`` on ``host:port`` while ``serving`` runs (the serve's watch, in this event loop: the
    gateway re-reads its key file on SIGHUP, which only the main thread's loop can be told); when it ends,
    ``stopping`` (Dynamo's processes told to stop, so that the streams end), then the frontend closed within
    ``FRONTEND_CLOSE_S``.

    Arguments:
        frontend: the kit's frontend; host, port: where it listens; serving: runs until the serve stops;
        stopping: called once ``serving`` has ended, before the frontend closes.
    """
    try:
        runner = await start_frontend(frontend, host, port)
    except OSError as exc:
        raise KitError(f"the OpenAI frontend could not listen on {host}:{port}: {exc.strerror or exc}; free the "
                       "port or pass another --openai-port.") from None
    try:
        await serving()
    finally:
        stopping()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(runner.cleanup(), FRONTEND_CLOSE_S)
