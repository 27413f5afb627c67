"""The OpenAI frontend as served: the OpenAI routes (``serve/openai/``) with the gateway (``serve/gateway/``) in
front of them when a key file is given. The two rooms share only ``serve/http/`` (the error, the body, the request
keys); this module is the one place that puts them together."""

from __future__ import annotations

import socket

from aiohttp import web

from trtllm_kit.errors import KitUsageError
from trtllm_kit.serve.gateway.middleware import Gateway
from trtllm_kit.serve.openai.app import OpenAIApp
from trtllm_kit.serve.openai.config import OpenAIConfig
from trtllm_kit.serve.openai.text import Tokenizer


class OpenAIFrontend(OpenAIApp):
    """The OpenAI application behind the gateway of ``config.api_keys`` (none without a key file).

    Arguments:
        config: the served models, where Triton is, the key file and usage log.
        tokenizer: the tokenizer of a single model (loaded from each route's ``tokenizer_dir`` when omitted).
    """

    def __init__(self, config: OpenAIConfig, tokenizer: Tokenizer | None = None) -> None:
        if config.api_keys is not None and config.api_key is not None:
            raise KitUsageError("--api-key and --api-keys both given; use one (a key file can hold one key).")
        super().__init__(config, tokenizer)
        self.gateway = None if config.api_keys is None else Gateway(config.api_keys, config.usage_log,
                                                                     self.metrics.registry)
        self.guard = self.gateway


async def start_frontend(frontend: OpenAIApp, host: str, port: int,
                         sock: socket.socket | None = None) -> web.AppRunner:
    """Start the frontend on ``host:port``, or on ``sock`` (a socket listening already); ``await runner.cleanup()``
    stops it.

    Arguments:
        frontend: the frontend (its tokenizer loaded).
        host: the bind address.
        port: the TCP port.
        sock: a listening socket to serve on instead (``host`` and ``port`` are then what it is bound to).
    """
    # handler_cancellation: a client that disconnects cancels its handler, which cancels its generation
    runner = web.AppRunner(frontend.app(), access_log=None, handler_cancellation=True, shutdown_timeout=5.0)
    await runner.setup()
    await (web.TCPSite(runner, host, port) if sock is None else web.SockSite(runner, sock)).start()
    return runner
