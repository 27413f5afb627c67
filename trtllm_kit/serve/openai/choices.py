"""A request of several choices (``n`` > 1, ``best_of``, or several prompts), whole or streamed: choice
``prompt_index × n + j``, the usage OpenAI counts (every prompt once, every completion).

A prompt sent as token ids (the direct path, and the llmapi target) is one engine request for all its choices:
the engine's ``n`` computes the prompt once (``sequences.py``). A text prompt to the BLS or ensemble is one engine
request per choice, choice ``j`` sampling with the seed ``seed + j`` (the engines' own rule for their sequences).
Streamed, each choice's chunks carry its ``index`` and come as they are made, the choices interleaved. The engine
requests of one request are admitted as one unit, a window of them at a time (``fanout.py``).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from functools import partial
from typing import Any

from aiohttp import web

from trtllm_kit.serve.generation import GenerationError
from trtllm_kit.serve.http.errors import HTTPError
from trtllm_kit.serve.http.exchange import ADMIT, USAGE
from trtllm_kit.serve.openai import prepare
from trtllm_kit.serve.openai.errors import generation_failure
from trtllm_kit.serve.openai.fanout import FanOut
from trtllm_kit.serve.openai.logprobs import Scorer
from trtllm_kit.serve.openai.metrics import FrontendMetrics
from trtllm_kit.serve.openai.protocol import ChoiceShape
from trtllm_kit.serve.openai.routes import Alias, Route
from trtllm_kit.serve.openai.run import Run, send
from trtllm_kit.serve.openai.sampling_fields import OpenAIRequest, Prompt
from trtllm_kit.serve.openai.sequences import SharedSequences
from trtllm_kit.wire import GenerationResponse

Job = tuple[Run, Scorer]


async def generate_choices(metrics: FrontendMetrics, request: web.Request, req: OpenAIRequest, prompts: list[Prompt],
                           route: Route, alias: Alias | None) -> web.StreamResponse:
    """Several choices at once: ``n`` per prompt (the best ``n`` of ``best_of``), whole or streamed.

    Arguments:
        metrics: the frontend's metrics; request: the HTTP request; req: the parsed request; prompts: its prompts;
        route, alias: where it goes.
    """
    kind = req.kind
    prepared = [prepare.prepared(route, prompt, req) for prompt in prompts]
    num_sequences = req.best_of or req.n
    admit = request.get(ADMIT)
    if admit is not None:
        admit(sum(prepare.most_prompt_tokens(route, p) + req.max_tokens * num_sequences for p, _ in prepared))
    ident = f"{'cmpl' if kind == 'text_completion' else 'chatcmpl'}-{uuid.uuid4().hex}"
    base = random.getrandbits(63) if req.seed is None else req.seed
    jobs: list[Job] = []
    shared: list[SharedSequences] = []
    direct = any(isinstance(prompt, tuple) for prompt, _ in prepared)
    fanout = FanOut(route.max_batch_size, num_sequences if direct else 1)  # its engine requests as one unit
    for i, (prompt, prompt_text) in enumerate(prepared):
        scorers = [Scorer(req.scoring, kind, route.tokenizer, req.skip_special_tokens, prompt_text)
                   for _ in range(req.n)]
        if isinstance(prompt, tuple):  # the engine's own n: one request, the prompt computed once
            assert route.client is not None, "the application is not started"
            many = num_sequences > 1
            gen = prepare.engine_request(route, prompt, req, f"{ident}-{i}", seed=base,
                                         n=req.n if many else None, best_of=req.best_of)
            sequences = SharedSequences(partial(fanout.stream, route.stream), gen)
            shared.append(sequences)
            jobs += [(Run(route, gen, req, show_ids=False, chunks=_source(sequences, j)), scorers[j])
                     for j in range(req.n)]
            continue
        if req.best_of is not None:
            raise HTTPError(f"best_of needs the model's tokenizer and its tensorrt_llm model, and {route.name!r} "
                               f"is served through {route.triton_model!r} alone; leave best_of out.", param="best_of")
        for j in range(req.n):
            gen = prepare.engine_request(route, prompt, req, f"{ident}-{i}-{j}", seed=(base + j) % 2**64)
            jobs.append((Run(route, gen, req, show_ids=False, chunks=partial(fanout.stream, route.stream, gen)),
                         scorers[j]))

    def usage() -> dict[str, int]:  # every prompt counted once, every completion (best_of's left-out ones too)
        each = [run.usage() for run, _ in jobs]
        prompt_tokens = sum(u["prompt_tokens"] for u in each[::req.n])
        completion_tokens = sum(u["completion_tokens"] for u in each) + sum(s.num_dropped_tokens for s in shared)
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens}

    request[USAGE] = usage
    shape = ChoiceShape(kind, ident, route.name, int(time.time()))
    headers = prepare.route_headers(route, alias)
    try:
        if req.stream:
            return await _streamed(request, metrics, route, shape, req, jobs, usage, headers)
        return await _whole(metrics, route, shape, jobs, usage, headers)
    finally:
        for sequences in shared:
            sequences.close()


def _source(sequences: SharedSequences, index: int) -> Callable[[], AsyncGenerator[GenerationResponse, None]]:
    return lambda: sequences.stream(index)


async def _whole(metrics: FrontendMetrics, route: Route, shape: ChoiceShape, jobs: list[Job],
                 usage: Callable[[], dict[str, int]], headers: dict[str, str]) -> web.Response:
    timer = metrics.timer(route.name)

    async def collect(index: int, run: Run, scorer: Scorer) -> dict[str, Any]:
        pieces = timer.timed(run.pieces())
        try:
            done = [piece async for piece in pieces]
        finally:
            await pieces.aclose()
        return prepare.choice(shape, index, run, scorer, done)

    tasks = [asyncio.ensure_future(collect(index, run, scorer)) for index, (run, scorer) in enumerate(jobs)]
    try:  # the first failure fails the request; leaving cancels every engine request
        choices = await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
    return web.json_response({**shape.whole(list(choices), usage()), "system_fingerprint": route.fingerprint},
                             headers=headers)


async def _streamed(request: web.Request, metrics: FrontendMetrics, route: Route, shape: ChoiceShape,
                    req: OpenAIRequest, jobs: list[Job], usage: Callable[[], dict[str, int]],
                    headers: dict[str, str]) -> web.StreamResponse:
    """Every choice's chunks as they come, then the usage chunk (``include_usage``) and ``[DONE]``."""
    timer = metrics.timer(route.name)
    events: asyncio.Queue[dict[str, Any] | BaseException | None] = asyncio.Queue()
    fingerprint = {"system_fingerprint": route.fingerprint}

    def put(chunk: dict[str, Any]) -> None:
        running = {"usage": usage()} if req.continuous_usage else {}
        events.put_nowait({**fingerprint, **chunk, **running})

    async def produce(index: int, run: Run, scorer: Scorer) -> None:
        pieces = timer.timed(run.pieces())
        opened = False

        def open_choice() -> None:  # the role (chat) and the echoed prompt, once the first response is in
            if shape.kind == "chat.completion":
                put(shape.chunk({"role": "assistant", "content": ""}, None, index=index))
            if scorer.echo_text:
                put(shape.chunk(scorer.echo_text, None, logprobs=scorer.prompt(run.prompt_scored), index=index))

        try:
            async for piece in pieces:
                if not opened:
                    opened = True
                    open_choice()
                put(shape.chunk(piece.text, None, None, scorer.tokens(piece.scored), index=index))
            if not opened:
                open_choice()
            put(shape.chunk(None, run.finish_reason, index=index))
            events.put_nowait(None)
        except Exception as exc:  # the request fails with its first failing choice
            events.put_nowait(exc)
        finally:
            await pieces.aclose()

    tasks = [asyncio.ensure_future(produce(index, run, scorer)) for index, (run, scorer) in enumerate(jobs)]
    try:
        first = await events.get()  # errors before the first chunk still get an HTTP status
        if isinstance(first, BaseException):
            raise first
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                               **headers})
        await response.prepare(request)
        num_done = 0 if first is not None else 1
        try:
            if first is not None:
                await send(response, first)
            while num_done < len(jobs):
                event = await events.get()
                if event is None:
                    num_done += 1
                elif isinstance(event, BaseException):
                    raise event
                else:
                    await send(response, event)
            if req.include_usage:
                await send(response, {**fingerprint, **shape.chunk(None, None), "choices": [], "usage": usage()})
        except (GenerationError, HTTPError) as exc:
            error = exc if isinstance(exc, HTTPError) else generation_failure(exc, req.guide_field)
            await send(response, error.body())
        except ConnectionResetError:  # the client left: cancelling the tasks cancels the generations
            return response
        await response.write(b"data: [DONE]\n\n")
        return response
    finally:
        for task in tasks:
            task.cancel()
