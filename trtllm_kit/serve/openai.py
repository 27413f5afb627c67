"""An OpenAI-compatible HTTP frontend (``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``) over Triton."""

from __future__ import annotations

import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from trtllm_kit.errors import KitUsageError
from trtllm_kit.serve.client import Chunk, GenerationError, GenerationRequest, TextClient
from trtllm_kit.serve.errors import error_response, generation_failure, parse_body
from trtllm_kit.serve.openai_metrics import CONTENT_TYPE, FrontendMetrics
from trtllm_kit.serve.openai_protocol import (
    ChoiceShape,
    RequestError,
    Sampling,
    check_fields,
    generation_request,
    parse_prompt,
    parse_sampling,
)
from trtllm_kit.serve.text import StopMatcher, Tokenizer


@dataclass(frozen=True)
class OpenAIConfig:
    """What the frontend serves: the Triton model behind it and the name clients use."""

    grpc_url: str
    served_name: str
    triton_model: str = "ensemble"
    tokenizer_dir: Path | None = None
    api_key: str | None = None
    api_keys: Path | None = None  # the gateway's key file (keys, limits, quotas)
    usage_log: Path | None = None  # the gateway's usage log (default: beside the key file)
    max_seq_len: int | None = None  # prompt plus output tokens; requests beyond it are refused with a 400
    triton_headers: tuple[tuple[str, str], ...] = ()  # gRPC metadata Triton's restricted protocols demand


class OpenAIFrontend:
    """The aiohttp application: validates requests, streams from Triton, answers in OpenAI's formats.

    Arguments:
        config: the served model and where Triton is.
        tokenizer: the model's tokenizer (loaded from ``config.tokenizer_dir`` when omitted).
    """

    def __init__(self, config: OpenAIConfig, tokenizer: Tokenizer | None = None) -> None:
        self.config = config
        self.tokenizer = tokenizer or (Tokenizer(config.tokenizer_dir) if config.tokenizer_dir else None)
        self.client: TextClient | None = None
        self.created = int(time.time())
        self.metrics = FrontendMetrics()
        self.gateway = None
        if config.api_keys is not None:
            if config.api_key is not None:
                raise KitUsageError("--api-key and --api-keys both given; use one (a key file can hold one key).")
            from trtllm_kit.serve.gateway.middleware import Gateway

            self.gateway = Gateway(config.api_keys, config.usage_log, self.metrics.registry)

    def app(self) -> web.Application:
        gateway = [] if self.gateway is None else [self.gateway.middleware]
        app = web.Application(middlewares=[self._measure, *gateway, self._errors])
        if self.gateway is not None:
            app.on_startup.append(self.gateway.on_startup)
            app.on_cleanup.append(self.gateway.on_cleanup)
        app.router.add_get("/metrics", self.prometheus_metrics)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, _app: web.Application) -> None:
        self.client = TextClient(self.config.grpc_url, self.config.triton_model, self.config.triton_headers)

    async def _close(self, _app: web.Application) -> None:
        if self.client is not None:
            await self.client.close()

    @web.middleware
    async def _errors(self, request: web.Request,
                      handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        try:
            self._authorize(request)
            return await handler(request)
        except RequestError as exc:
            return error_response(exc)
        except GenerationError as exc:
            return error_response(generation_failure(exc))
        except KitUsageError as exc:
            return error_response(RequestError(str(exc)))
        except web.HTTPException as exc:
            return error_response(RequestError(f"{request.method} {request.path}: {exc.reason}", exc.status))
        except Exception as exc:  # a bug: the client gets JSON and no traceback; the log gets the details
            logging.getLogger(__name__).exception("the OpenAI frontend failed a request")
            return error_response(RequestError(f"internal error ({type(exc).__name__}); see the server log.", 500,
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
                self.metrics.answered(self.config.served_name, endpoint, 500)
            raise
        if measured:
            self.metrics.answered(self.config.served_name, endpoint, response.status)
        return response

    async def prometheus_metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE})

    def _authorize(self, request: web.Request) -> None:
        key = self.config.api_key
        if key is None:
            return
        given = request.headers.get("Authorization", "")
        try:
            matches = hmac.compare_digest(given.encode(), f"Bearer {key}".encode())
        except UnicodeEncodeError:  # a header that is not UTF-8 arrives with surrogate escapes: not the key
            matches = False
        if not matches:
            raise RequestError("Incorrect API key provided: pass it as 'Authorization: Bearer KEY'.", 401,
                               code="invalid_api_key")

    async def models(self, _request: web.Request) -> web.Response:
        entry = {"id": self.config.served_name, "object": "model", "created": self.created, "owned_by": "trtllm-kit"}
        return web.json_response({"object": "list", "data": [entry]})

    async def _body(self, request: web.Request, kind: str) -> dict[str, Any]:
        body = parse_body(await request.read())
        model = body.get("model")
        if model is None:
            raise RequestError(f"'model' is required; this server has {self.config.served_name!r}.", param="model")
        if model not in (self.config.served_name, self.config.triton_model):
            raise RequestError(f"The model {model!r} does not exist; this server has {self.config.served_name!r}.",
                               404, param="model", code="model_not_found")
        check_fields(body, kind)
        return body

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request, "text_completion")
        prompt = parse_prompt(body, self.tokenizer.vocab_size if self.tokenizer else None)
        if isinstance(prompt, tuple) and self.tokenizer is None:
            raise RequestError("token-id prompts need the model's tokenizer to return text, and this server has "
                               "none; send the prompt as text.", param="prompt")
        return await self._respond(request, body, prompt, "text_completion")

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request, "chat.completion")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise RequestError("messages must be a non-empty list of {role, content} objects.", param="messages")
        if self.tokenizer is None:
            raise RequestError("this server has no tokenizer for a chat template; use /v1/completions.")
        return await self._respond(request, body, self.tokenizer.chat_prompt(messages), "chat.completion")

    async def _respond(self, request: web.Request, body: dict[str, Any], prompt: str | tuple[int, ...],
                       kind: str) -> web.StreamResponse:
        sampling = parse_sampling(body, kind, self.config.max_seq_len)
        self._check_length(prompt, sampling)
        ident = f"{'cmpl' if kind == 'text_completion' else 'chatcmpl'}-{uuid.uuid4().hex}"
        eos_id = self.tokenizer.eos_id if self.tokenizer is not None and isinstance(prompt, tuple) else None
        run = Run(self, generation_request(prompt, sampling, ident, eos_id), sampling)
        request["usage"] = run.usage  # the gateway charges it when the request ends
        timer = self.metrics.timer(self.config.served_name)
        shape = ChoiceShape(kind, ident, self.config.served_name, int(time.time()))
        if not sampling.stream:
            whole = timer.timed(run.pieces())
            try:  # a client that leaves cancels this handler, and closing ``whole`` cancels the generation
                text = "".join([piece.text async for piece in whole])
            finally:
                await whole.aclose()
            return web.json_response(shape.whole(text, run.finish_reason, run.usage()))

        def usage() -> dict[str, Any]:  # ``continuous_usage_stats``: the running usage in every chunk
            return {"usage": run.usage()} if sampling.continuous_usage else {}

        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        pieces = timer.timed(run.pieces())
        try:
            first = await anext(pieces, None)  # errors before the first token still get an HTTP status
        except BaseException:
            await pieces.aclose()
            raise
        await response.prepare(request)
        try:
            if kind == "chat.completion":
                await _send(response, shape.chunk({"role": "assistant", "content": ""}, None))
            if first is not None:
                await _send(response, {**shape.chunk(first.text, None, first.token_ids), **usage()})
            async for piece in pieces:
                await _send(response, {**shape.chunk(piece.text, None, piece.token_ids), **usage()})
            await _send(response, {**shape.chunk(None, run.finish_reason), **usage()})
            if sampling.include_usage:
                await _send(response, {**shape.chunk(None, None), "choices": [], "usage": run.usage()})
        except (GenerationError, RequestError) as exc:
            error = exc if isinstance(exc, RequestError) else generation_failure(exc)
            await _send(response, error.body())
        except ConnectionResetError:  # the client left: closing ``pieces`` cancels the generation
            return response
        finally:
            await pieces.aclose()
        await response.write(b"data: [DONE]\n\n")
        return response


    def _check_length(self, prompt: str | tuple[int, ...], sampling: Sampling) -> None:
        """Refuse a prompt that is empty or, with ``max_tokens``, longer than ``max_seq_len``."""
        limit, tokenizer = self.config.max_seq_len, self.tokenizer
        if limit is None:
            return
        if isinstance(prompt, tuple):
            num_prompt = len(prompt)
        elif tokenizer is not None:
            num_prompt = tokenizer.count(prompt)
        else:
            return
        if num_prompt + sampling.max_tokens > limit:
            raise RequestError(f"this model's maximum context length is {limit} tokens; the request asks for "
                               f"{num_prompt} prompt + {sampling.max_tokens} completion tokens: shorten the prompt "
                               "or lower max_tokens.", param="max_tokens", code="context_length_exceeded")


async def _send(response: web.StreamResponse, payload: dict[str, Any]) -> None:
    await response.write(f"data: {json.dumps(payload)}\n\n".encode())


@dataclass(frozen=True)
class Piece:
    """What one streamed event carries: text that may be shown, and for token-id prompts the ids that arrived."""

    text: str
    token_ids: tuple[int, ...] | None = None


class Run:
    """One generation: streams text through the stop matcher and counts tokens.

    Text prompts go to the ensemble or BLS and yield only non-empty text. Token-id prompts go to
    ``tensorrt_llm``: every response yields its ids, with the text they complete (often empty while a multi-byte
    character or a stop sequence is pending), so clients can count tokens as they arrive.
    """

    def __init__(self, frontend: OpenAIFrontend, gen: GenerationRequest, sampling: Sampling) -> None:
        self.frontend, self.gen, self.sampling = frontend, gen, sampling
        self.num_responses = 0  # one token each unless the model reports its count
        self.num_reported: int | None = None
        self.num_input_tokens: int | None = len(gen.prompt) if isinstance(gen.prompt, tuple) else None
        self.finish_reason = "stop"

    async def pieces(self) -> AsyncGenerator[Piece, None]:
        """The pieces of the answer as they may be shown."""
        assert self.frontend.client is not None, "the application is not started"
        matcher = StopMatcher(self.sampling.stops)
        tokenizer = self.frontend.tokenizer
        decoder = tokenizer.decoder() if isinstance(self.gen.prompt, tuple) and tokenizer is not None else None
        stream = self.frontend.client.stream(self.gen)
        try:
            async for chunk in stream:
                self._count(chunk)
                if decoder is not None and chunk.token_ids is not None:
                    shown = matcher.feed(decoder.feed(chunk.token_ids))
                    yield Piece(shown, chunk.token_ids)
                else:
                    shown = matcher.feed(chunk.text)
                    if shown:
                        yield Piece(shown)
                if matcher.stopped:
                    return
            rest = matcher.flush() if decoder is None else matcher.feed(decoder.flush()) + matcher.flush()
            if rest:
                yield Piece(rest, () if decoder is not None else None)
            if self.num_output_tokens >= self.gen.max_tokens:
                self.finish_reason = "length"
        finally:
            await stream.aclose()

    def _count(self, chunk: Chunk) -> None:
        if chunk.token_ids is not None:
            self.num_reported = (self.num_reported or 0) + len(chunk.token_ids)
            return
        if chunk.num_output_tokens is not None:  # reported counts are cumulative
            self.num_reported = max(self.num_reported or 0, chunk.num_output_tokens)
        self.num_responses += 1
        if chunk.num_input_tokens is not None:
            self.num_input_tokens = chunk.num_input_tokens

    @property
    def num_output_tokens(self) -> int:
        return self.num_reported if self.num_reported is not None else self.num_responses

    def usage(self) -> dict[str, int]:
        prompt_tokens = self.num_input_tokens
        if prompt_tokens is None:
            tokenizer = self.frontend.tokenizer
            prompt = self.gen.prompt
            prompt_tokens = tokenizer.count(prompt) if tokenizer is not None and isinstance(prompt, str) else 0
            self.num_input_tokens = prompt_tokens
        return {"prompt_tokens": prompt_tokens, "completion_tokens": self.num_output_tokens,
                "total_tokens": prompt_tokens + self.num_output_tokens}


async def start_frontend(frontend: OpenAIFrontend, host: str, port: int) -> web.AppRunner:
    """Start the frontend on ``host:port``; ``await runner.cleanup()`` stops it.

    Arguments:
        frontend: the frontend (its tokenizer loaded).
        host: the bind address.
        port: the TCP port.
    """
    # handler_cancellation: a client that disconnects cancels its handler, which cancels its generation
    runner = web.AppRunner(frontend.app(), access_log=None, handler_cancellation=True, shutdown_timeout=5.0)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
