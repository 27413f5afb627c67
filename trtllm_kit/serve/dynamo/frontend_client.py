"""The kit's frontend's client of Dynamo's OpenAI frontend: a route's ``stream`` as one ``/v1/completions`` request
to the frontend ``serve --dynamo`` binds on a private loopback port, on one kept-alive connection.

The kit's frontend (``gateway.py``) parses, checks, tokenizes and applies the chat template, then sends each engine
request here as token ids; Dynamo's frontend routes it to a worker (KV-aware, migrating a stream whose worker
dies) and streams text back, with the running usage in every chunk (``continuous_usage_stats``), which the kit's
frontend counts and charges. Stop strings are matched by the kit's frontend, which leaves the stream when one
arrives (closing the connection cancels the request on the worker). What the workers cannot do is refused here
in one sentence before anything is sent (``refusal``); a worker's own refusal comes back with its sentence and
status (the worker raises Dynamo's ``InvalidArgument``, which the frontend answers with its message). A whole
answer with no stop strings is asked for whole, one read instead of a stream's chunks (``is_whole``).

With logprobs asked for, the client answers the kit's frontend in token ids with their scores (``logprobs.py``),
which it decodes and turns into OpenAI's logprobs as a plain serve does; an answer with the prompt's logprobs is
streamed from Dynamo's frontend even when whole, as they come with its first chunk.
"""

from __future__ import annotations

import contextlib
import json
import socket
import uuid
from collections.abc import AsyncGenerator, Callable
from typing import Any

import aiohttp

from trtllm_kit.serve.client import TextClient
from trtllm_kit.serve.dynamo.logprobs import logprob_fields, prompt_scored, scored_tokens
from trtllm_kit.serve.generation import GenerationError
from trtllm_kit.wire import GenerationRequest, GenerationResponse
from trtllm_kit.wire.openai_body import encode_openai_body
from trtllm_kit.wire.request import BEAM_WEIGHTS

COMPLETIONS = "/v1/completions"
MODELS = "/v1/models"
METRICS = "/metrics"
READY_TIMEOUT_S = 10.0
REQUEST_ID_HEADER = "x-dynamo-request-id"  # Dynamo's frontend takes a UUID there as the request's id
MATCHED_HERE = ("stop_strings", "include_stop_str_in_output")  # the kit's frontend matches stop strings itself
WHY = "serve --dynamo's workers"
SocketFactory = Callable[[tuple[Any, ...]], socket.socket]  # aiohttp's socket_factory


def refusal(req: GenerationRequest) -> str | None:
    """The sentence refusing what the Dynamo workers cannot do for ``req``, or None.

    Arguments:
        req: the kit's frontend's engine request.
    """
    if req.lora is not None:
        return (f"the adapter {req.lora.name!r} cannot run on {WHY}, which serve the base model alone; name the "
                "base model, or serve the adapter without --dynamo.")
    if req.prompt_logprobs is not None and req.logprobs is None:
        return (f"prompt_logprobs is {req.prompt_logprobs} without logprobs; {WHY} score a prompt only with its "
                "answer: set logprobs too, or serve without --dynamo.")
    if (req.n or 1) > 1 or req.best_of is not None:
        return (f"n is {req.n or 1} and best_of {req.best_of}; {WHY} answer one choice per token-id prompt: send "
                "n=1 and no best_of, or the prompt as text.")
    weights = {name: getattr(req, name) for name in BEAM_WEIGHTS}
    if req.beam_width not in (None, 1) or any(value is not None for value in weights.values()):
        said = "".join(f" and {name} {value}" for name, value in weights.items())
        return (f"beam_width is {req.beam_width}{said}; {WHY} decode without beams: leave "
                f"{' and '.join(('beam_width', *weights))} out.")
    return None


def is_whole(req: GenerationRequest) -> bool:
    """Whether ``req``'s answer is asked of Dynamo's frontend whole, in one read: the client's answer is whole
    (``streaming`` False) and has no stop strings, which the kit's frontend cuts from a stream and leaves it at, nor
    prompt logprobs, which come with the first chunk.

    Arguments:
        req: the engine request.
    """
    return req.streaming is False and not req.stop_strings and req.prompt_logprobs is None


def completion_body(model: str, req: GenerationRequest) -> dict[str, Any]:
    """Dynamo's completion request for ``req``: the wire's OpenAI body but the stop strings (``MATCHED_HERE``);
    streamed with the running usage asked for, unless ``is_whole``; logprobs with their tokens named by id. The
    worker refuses a guide the CPU runtime cannot guide by, in its sentence.

    Arguments:
        model: the served name; req: the engine request (``refusal`` is None for it).
    """
    return {**encode_openai_body(req, model, stream=not is_whole(req), skip=MATCHED_HERE), **logprob_fields(req)}


def dynamo_request_id(request_id: str) -> str | None:
    """The id Dynamo's frontend and workers log the request under: the UUID of the kit's ``cmpl-UUID`` (the
    response's ``id``, so a worker's log names the requests the client saw), None for another id (a choice's
    ``cmpl-UUID-i-j``: Dynamo makes one).

    Arguments:
        request_id: the kit's engine request id.
    """
    _, _, rest = request_id.partition("-")
    try:
        uuid.UUID(rest)
    except ValueError:
        return None
    return rest


def chunk_response(event: dict[str, Any], num_top: int | None = None) -> GenerationResponse | None:
    """One streamed chunk of Dynamo's frontend as the kit's frontend reads it: the text and the running counts, or
    with logprobs asked for, the token ids and their scores (and the first chunk, the prompt's when asked for);
    None for a chunk carrying none of them. An error event raises ``GenerationError`` with its message and code.

    Arguments:
        event: the chunk's JSON (or a whole answer's); num_top: the alternatives asked per token (None: no
        logprobs).
    """
    error = event.get("error")
    if error is not None:
        status = error.get("code") if isinstance(error, dict) else None
        message = error.get("message") if isinstance(error, dict) else str(error)
        raise GenerationError(str(message), status=status if isinstance(status, int) else 500)
    if num_top is not None:
        scored = tuple(token for choice in event.get("choices") or []
                       for token in scored_tokens(choice.get("logprobs") or {}, num_top))
        prompt = prompt_scored(event)
        return GenerationResponse(token_ids=tuple(t for t, _, _ in scored), scored=scored, num_top=num_top,
                                  prompt_scored=prompt) if scored or prompt else None
    text = "".join(choice.get("text") or "" for choice in event.get("choices") or [])
    usage = event.get("usage") or {}
    if not text and not usage:
        return None
    return GenerationResponse(texts=(text,), num_input_tokens=usage.get("prompt_tokens"),
                              num_output_tokens=usage.get("completion_tokens"))


class DynamoFrontendClient(TextClient):
    """Streams from Dynamo's OpenAI frontend at ``url``.

    Arguments:
        url: ``http://host:port`` of Dynamo's frontend; model: the name it serves the model under;
        socket_factory: makes the connections' sockets (aiohttp's own when None).
    """

    def __init__(self, url: str, model: str, socket_factory: SocketFactory | None = None) -> None:
        super().__init__(url, model)
        self.socket_factory = socket_factory
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """One HTTP session (made inside the running event loop on first use), its sockets made by
        ``socket_factory`` (the serve's private network namespace) when given."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                                                  connector=aiohttp.TCPConnector(socket_factory=self.socket_factory))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
        await super().close()

    async def ready(self) -> bool:
        """Whether Dynamo's frontend lists the model (False on any failure)."""
        try:
            async with self.session.get(f"{self.url}{MODELS}",
                                        timeout=aiohttp.ClientTimeout(total=READY_TIMEOUT_S)) as response:
                listed = await response.json()
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return False
        return any(model.get("id") == self.model for model in listed.get("data") or [])

    async def metrics(self) -> bytes:
        """Dynamo's frontend's Prometheus exposition (its routing, KV events and per-model series; empty on any
        failure)."""
        return await self.scrape(f"{self.url}{METRICS}") or b""

    async def scrape(self, url: str) -> bytes | None:
        """The body of a ``/metrics`` in the serve's network namespace (Dynamo's frontend's, a worker's), None when
        it does not answer 200 within ``READY_TIMEOUT_S``.

        Arguments:
            url: its address.
        """
        try:
            async with self.session.get(url, timeout=aiohttp.ClientTimeout(total=READY_TIMEOUT_S)) as response:
                return await response.read() if response.status == 200 else None
        except (aiohttp.ClientError, TimeoutError):
            return None

    async def takes_lora_rows(self) -> bool:
        return False  # an adapter goes by name, and is refused (``refusal``)

    async def stream(self, req: GenerationRequest) -> AsyncGenerator[GenerationResponse, None]:
        """Yield the text of each chunk with the running usage (or of the whole answer, ``is_whole``); leaving
        early cancels the request.

        Arguments:
            req: the request.
        """
        refused = refusal(req)
        if refused is not None:
            raise GenerationError(refused, status=400)
        assert self.model is not None
        try:
            request_id = dynamo_request_id(req.request_id)
            headers = {} if request_id is None else {REQUEST_ID_HEADER: request_id}
            async with self.session.post(f"{self.url}{COMPLETIONS}", json=completion_body(self.model, req),
                                         headers=headers) as answer:
                if answer.status != 200:
                    raise _refused(answer.status, await answer.text())
                if is_whole(req):
                    response = chunk_response(json.loads(await answer.read()), req.logprobs)
                    if response is not None:
                        yield response
                    return
                ack_at_once(answer)
                async for raw in answer.content:
                    line = raw.decode().strip()
                    if not line.startswith("data:") or line == "data: [DONE]":
                        continue
                    response = chunk_response(json.loads(line.removeprefix("data:")), req.logprobs)
                    if response is not None:
                        yield response
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise GenerationError(f"Dynamo's frontend at {self.url} failed the request: {type(exc).__name__}: "
                                  f"{exc}", status=503) from None


def ack_at_once(answer: aiohttp.ClientResponse) -> None:
    """Acknowledge the rest of ``answer``'s stream as it is read: Dynamo's frontend writes each chunk as its own
    small segment with Nagle's algorithm on, so each waits for the ACK of the one before, which a kept-alive
    connection delays (40 ms on Linux) unless ``TCP_QUICKACK`` is set once its answer has begun.

    Arguments:
        answer: the streamed answer, its headers read.
    """
    quickack = getattr(socket, "TCP_QUICKACK", None)  # Linux only
    connection = answer.connection
    sock = None if quickack is None or connection is None or connection.transport is None else \
        connection.transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):  # a socket that is not TCP
            sock.setsockopt(socket.IPPROTO_TCP, quickack, 1)


def _refused(status: int, text: str) -> GenerationError:
    """The error of a whole non-200 answer: its ``message`` (``error.message`` in OpenAI's shape) and status."""
    try:
        body = json.loads(text)
    except ValueError:
        return GenerationError(f"Dynamo's frontend answered {status}: {text.strip()[:500]}", status=status)
    error = body.get("error") if isinstance(body.get("error"), dict) else body
    return GenerationError(str(error.get("message") or text), status=status)
