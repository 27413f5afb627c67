"""An OpenAI-compatible HTTP frontend (``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``) over Triton."""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import Counter

from trtllm_kit import __version__
from trtllm_kit.errors import KitUsageError
from trtllm_kit.serve.generation import GenerationError
from trtllm_kit.serve.http.body import json_body
from trtllm_kit.serve.http.errors import HTTPError, error_response
from trtllm_kit.serve.http.exchange import METRICS_PATH, OPEN_PATHS, ROUTE_NAME, Guard
from trtllm_kit.serve.openai.adapter_admin import AdapterAdmin, serve_recorded
from trtllm_kit.serve.openai.adapters import AdapterSet
from trtllm_kit.serve.openai.config import OpenAIConfig
from trtllm_kit.serve.openai.errors import generation_failure
from trtllm_kit.serve.openai.metrics import CONTENT_TYPE, FrontendMetrics
from trtllm_kit.serve.openai.request_limits import MAX_BODY_BYTES
from trtllm_kit.serve.openai.requests import ChatRequest, CompletionRequest
from trtllm_kit.serve.openai.routes import Alias, Route
from trtllm_kit.serve.openai.sampling_fields import OpenAIRequest, Prompt
from trtllm_kit.serve.openai.serving import serve
from trtllm_kit.serve.openai.text import Tokenizer

PARSED: web.RequestKey[OpenAIRequest] = web.RequestKey("openai_request")  # the request as its handler parsed it


class OpenAIApp:
    """The aiohttp application: validates requests, streams from Triton, answers in OpenAI's formats. A ``guard``
    (the gateway, set by ``serve/frontend.py``) runs inside its error middleware, in front of every handler.

    Arguments:
        config: the served models and where Triton is.
        tokenizer: the tokenizer of a single model (loaded from each route's ``tokenizer_dir`` when omitted).
    """

    def __init__(self, config: OpenAIConfig, tokenizer: Tokenizer | None = None) -> None:
        self.config = config
        self.table = config.route_table()
        for route in self.table.routes.values():
            route.tokenizer = route.tokenizer or tokenizer
            route.load_tokenizer()
        self.created = int(time.time())
        self.metrics = FrontendMetrics()
        self.alias_requests = Counter("trtllm_kit_openai_alias_requests", "Requests for an A/B alias, by the "
                                      "model chosen.", ("alias", "model"), registry=self.metrics.registry)
        self.guard: Guard | None = None
        self.adapters = self.table.adapters = AdapterSet(self.metrics.registry)  # LoRA adapters named like models
        serve_recorded(self.adapters, self.table)

    def app(self) -> web.Application:
        guard = [] if self.guard is None else [self.guard.middleware]
        app = web.Application(middlewares=[self._measure, self._errors, *guard],  # the guard's errors are JSON
                              client_max_size=MAX_BODY_BYTES)
        if self.guard is not None:
            app.on_startup.append(self.guard.on_startup)
            app.on_cleanup.append(self.guard.on_cleanup)
        app.router.add_get(METRICS_PATH, self.prometheus_metrics)
        app.router.add_get("/health", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        AdapterAdmin(self.table, self.adapters, self.guard is not None).add_routes(app)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, _app: web.Application) -> None:
        for route in self.table.routes.values():
            route.open(self.config.grpc_url, self.config.triton_headers)

    async def _close(self, _app: web.Application) -> None:
        for route in self.table.routes.values():
            if route.client is not None:
                await route.client.close()

    @web.middleware
    async def _errors(self, request: web.Request,
                      handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        try:
            self._authorize(request)
            return await handler(request)
        except HTTPError as exc:
            return error_response(exc)
        except GenerationError as exc:
            parsed = request.get(PARSED)
            return error_response(generation_failure(exc, None if parsed is None else parsed.guide_field))
        except KitUsageError as exc:
            return error_response(HTTPError(str(exc)))
        except web.HTTPException as exc:
            return error_response(HTTPError(f"{request.method} {request.path}: {exc.reason}", exc.status))
        except Exception as exc:  # a bug: the client gets JSON and no traceback; the log gets the details
            logging.getLogger(__name__).exception("the OpenAI frontend failed a request")
            return error_response(HTTPError(f"internal error ({type(exc).__name__}); see the server log.", 500,
                                            kind="server_error"))

    @web.middleware
    async def _measure(self, request: web.Request,
                       handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        measured = request.method == "POST" and request.path in ("/v1/completions", "/v1/chat/completions")
        endpoint = request.path[4:].replace("/", "_")
        try:
            response = await handler(request)
        except Exception:
            if measured:
                self.metrics.answered(request.get(ROUTE_NAME, ""), endpoint, 500)
            raise
        if measured:
            self.metrics.answered(request.get(ROUTE_NAME, ""), endpoint, response.status)
        return response

    async def prometheus_metrics(self, request: web.Request) -> web.Response:
        per_key = b"" if self.guard is None else self.guard.per_key_metrics(request)  # for an admin key only
        return web.Response(body=self.metrics.exposition() + per_key, headers={"Content-Type": CONTENT_TYPE})

    def _authorize(self, request: web.Request) -> None:
        key = self.config.api_key
        if key is None or request.path in OPEN_PATHS:
            return
        given = request.headers.get("Authorization", "")
        try:
            matches = hmac.compare_digest(given.encode(), f"Bearer {key}".encode())
        except UnicodeEncodeError:  # a header that is not UTF-8 arrives with surrogate escapes: not the key
            matches = False
        if not matches:
            raise HTTPError("Incorrect API key provided: pass it as 'Authorization: Bearer KEY'.", 401,
                            code="invalid_api_key")

    async def health(self, _request: web.Request) -> web.Response:
        """200 when every served model is ready in Triton, else 503 (an empty body either way, as vLLM answers)."""
        clients = [route.client for route in self.table.routes.values()]
        ready = all([client is not None and await client.ready() for client in clients])
        return web.Response(status=200 if ready else 503)

    async def version(self, _request: web.Request) -> web.Response:
        return web.json_response({"version": __version__})

    async def models(self, _request: web.Request) -> web.Response:
        entries = []
        for name in self.table.names:
            route = self.table.routes.get(name)
            if route is None:  # an alias: the smallest limit of its models
                alias = self.table.aliases[name]
                limits = [self.table.routes[m].max_seq_len for m, _ in alias.shares]
                max_len = None if None in limits else min(x for x in limits if x is not None)
            else:
                max_len = route.max_seq_len
            entries.append({"id": name, "object": "model", "created": self.created, "owned_by": "trtllm-kit",
                            "max_model_len": max_len})
        entries += self.adapters.cards(self.created, lambda name: self.table.routes[name].max_seq_len)
        return web.json_response({"object": "list", "data": entries})

    def _has(self) -> str:
        return ", ".join(repr(name) for name in self.table.names)

    async def _route(self, request: web.Request) -> tuple[dict[str, Any], Route, Alias | None]:
        """The request's body and the route its ``model`` names (through an alias when it names one)."""
        body = await json_body(request)  # the object the gateway decided on, when it runs
        model = body.get("model")
        if model is None:
            raise HTTPError(f"'model' is required; this server has {self._has()}.", param="model")
        user = body.get("user")
        try:
            route, alias = self.table.resolve(str(model), user if isinstance(user, str) else None)
        except LookupError:
            raise HTTPError(f"The model {model!r} does not exist; this server has {self._has()}.", 404,
                            param="model", code="model_not_found") from None
        request[ROUTE_NAME] = route.name
        if alias is not None:
            self.alias_requests.labels(alias.name, route.name).inc()
        return body, route, alias

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body, route, alias = await self._route(request)
        req = request[PARSED] = CompletionRequest.parse(
            body, max_seq_len=route.max_seq_len, vocab_size=route.tokenizer.vocab_size if route.tokenizer else None)
        if any(isinstance(prompt, tuple) for prompt in req.prompts) and route.tokenizer is None:
            raise HTTPError("token-id prompts need the model's tokenizer to return text, and this server has none; "
                            "send the prompt as text.", param="prompt")
        return await self._respond(request, req, req.prompts, route, alias)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        body, route, alias = await self._route(request)
        req = request[PARSED] = ChatRequest.parse(body, max_seq_len=route.max_seq_len)
        if route.tokenizer is None:
            raise HTTPError("this server has no tokenizer for a chat template; use /v1/completions.")
        return await self._respond(request, req, [route.tokenizer.chat_prompt(req.chat_messages)], route, alias)

    async def _respond(self, request: web.Request, req: OpenAIRequest, prompts: list[Prompt], route: Route,
                       alias: Alias | None) -> web.StreamResponse:
        route.in_flight += 1  # a reload waits for this route's requests before it unloads its models
        try:
            return await serve(self.metrics, request, req, prompts, route, alias)
        finally:
            route.in_flight -= 1
