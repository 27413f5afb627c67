"""One serving flow for every generation request, of any number of prompts and choices, whole or streamed: choice
``prompt_index × n + j``, the usage OpenAI counts (every prompt once, every completion).

A request of one choice is one engine request, with the request's seed; a prompt sent as token ids gets each chunk's
ids back. A prompt of several choices sent as token ids (the direct path, and the llmapi target) is one engine
request for all of them: the engine's ``n`` computes the prompt once (``sequences.py``). A text prompt to the BLS or
ensemble is one engine request per choice, choice ``j`` sampling with the seed ``seed + j`` (the engines' own rule
for their sequences). The engine requests of one request are admitted as one unit, a window of them at a time
(``fanout.py``). Streamed, each choice's chunks carry its ``index`` and come as they are made, the choices
interleaved; errors before the first chunk still get an HTTP status.
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
from trtllm_kit.serve.openai.bls_route import refuse_unanswered
from trtllm_kit.serve.openai.choice_stream import ChoiceStream, Chunk
from trtllm_kit.serve.openai.engine_input import (
    check_logprob_entries,
    engine_request,
    most_prompt_tokens,
    prompt_as_sent,
)
from trtllm_kit.serve.openai.errors import generation_failure
from trtllm_kit.serve.openai.fanout import FanOut
from trtllm_kit.serve.openai.logprobs import Scorer
from trtllm_kit.serve.openai.metrics import FrontendMetrics
from trtllm_kit.serve.openai.responses import DONE, ChoiceShape, event_stream, route_headers, send, speculative_usage
from trtllm_kit.serve.openai.routes import Alias, Route
from trtllm_kit.serve.openai.sampling_fields import OpenAIRequest, Prompt
from trtllm_kit.serve.openai.sequences import SharedSequences
from trtllm_kit.wire import GenerationResponse

Job = tuple[ChoiceStream, Scorer]
Usage = Callable[[], dict[str, Any]]


async def serve(metrics: FrontendMetrics, request: web.Request, req: OpenAIRequest, prompts: list[Prompt],
                route: Route, alias: Alias | None) -> web.StreamResponse:
    """The answer to a parsed request: ``n`` choices per prompt (the best ``n`` of ``best_of``), whole or streamed.

    Arguments:
        metrics: the frontend's metrics; request: the HTTP request; req: the parsed request; prompts: its prompts
        (text or token ids); route, alias: where it goes.
    """
    if route.num_draft_tokens is not None:
        refuse_unanswered(req, prompts)
    check_logprob_entries(route, prompts, req)
    sent = [prompt_as_sent(route, prompt, req) for prompt in prompts]
    admit = request.get(ADMIT)
    if admit is not None:  # the gateway reserves the most tokens the request can use, or refuses it
        num_sequences = req.best_of or req.n
        admit(sum(most_prompt_tokens(route, p) + req.max_tokens * num_sequences for p, _ in sent))
    ident = f"{'cmpl' if req.kind == 'text_completion' else 'chatcmpl'}-{uuid.uuid4().hex}"
    shared: list[SharedSequences] = []
    if len(prompts) * req.n == 1 and req.best_of is None:
        (prompt, prompt_text), = sent
        gen = engine_request(route, prompt, req, ident, streaming=req.stream)  # a client may read a whole answer once
        jobs = [(ChoiceStream(route, gen, req, show_ids=isinstance(prompts[0], tuple)),
                 _scorer(route, req, prompt_text))]
    else:
        jobs = _choices(route, req, sent, ident, shared)

    def usage() -> dict[str, Any]:  # every prompt counted once, every completion (best_of's left-out ones too)
        each = [stream.usage() for stream, _ in jobs]
        prompt_tokens = sum(u["prompt_tokens"] for u in each[::req.n])
        completion_tokens = sum(u["completion_tokens"] for u in each) + sum(s.num_dropped_tokens for s in shared)
        speculative = speculative_usage([a for stream, _ in jobs if (a := stream.draft_acceptance) is not None])
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                **({} if speculative is None else {"speculative": speculative})}

    request[USAGE] = usage  # the gateway charges it when the request ends
    shape = ChoiceShape(req.kind, ident, route.name, int(time.time()))
    headers = route_headers(route, alias)
    try:
        if req.stream:
            return await _streamed(request, metrics, route, shape, req, jobs, usage, headers)
        return await _whole(metrics, route, shape, jobs, usage, headers)
    finally:
        for sequences in shared:
            sequences.close()


def _scorer(route: Route, req: OpenAIRequest, prompt_text: str) -> Scorer:
    return Scorer(req.scoring, req.kind, route.tokenizer, req.skip_special_tokens, prompt_text)


def _choices(route: Route, req: OpenAIRequest, sent: list[tuple[Prompt, str]], ident: str,
             shared: list[SharedSequences]) -> list[Job]:
    """The choices of a request of several: one engine request per prompt sent as token ids (its sequences shared
    out, ``shared`` gaining them), one per choice of a text prompt."""
    base = random.getrandbits(63) if req.seed is None else req.seed
    num_sequences = req.best_of or req.n
    direct = any(isinstance(prompt, tuple) for prompt, _ in sent)
    fanout = FanOut(route.max_batch_size, num_sequences if direct else 1)  # its engine requests as one unit
    jobs: list[Job] = []
    for i, (prompt, prompt_text) in enumerate(sent):
        scorers = [_scorer(route, req, prompt_text) for _ in range(req.n)]
        if isinstance(prompt, tuple):  # the engine's own n: one request, the prompt computed once
            assert route.client is not None, "the application is not started"
            many = num_sequences > 1
            gen = engine_request(route, prompt, req, f"{ident}-{i}", seed=base, n=req.n if many else None,
                                 best_of=req.best_of)
            sequences = SharedSequences(partial(fanout.stream, route.stream), gen)
            shared.append(sequences)
            jobs += [(ChoiceStream(route, gen, req, show_ids=False, responses=_source(sequences, j)), scorers[j])
                     for j in range(req.n)]
            continue
        if req.best_of is not None:
            raise HTTPError(f"best_of needs the model's tokenizer and its tensorrt_llm model, and {route.name!r} is "
                            f"served through {route.triton_model!r} alone; leave best_of out.", param="best_of")
        for j in range(req.n):
            gen = engine_request(route, prompt, req, f"{ident}-{i}-{j}", seed=(base + j) % 2**64)
            jobs.append((ChoiceStream(route, gen, req, show_ids=False,
                                      responses=partial(fanout.stream, route.stream, gen)), scorers[j]))
    return jobs


def _source(sequences: SharedSequences, index: int) -> Callable[[], AsyncGenerator[GenerationResponse, None]]:
    return lambda: sequences.stream(index)


def _whole_choice(shape: ChoiceShape, index: int, stream: ChoiceStream, scorer: Scorer,
                  done: list[Chunk]) -> dict[str, Any]:
    """A whole choice from the chunks its stream yielded."""
    text = scorer.echo_text + "".join(chunk.text for chunk in done)
    logprobs = scorer.whole(stream.prompt_scored, tuple(t for chunk in done for t in chunk.scored))
    return shape.choice(index, text, stream.finish_reason, logprobs)


async def _whole(metrics: FrontendMetrics, route: Route, shape: ChoiceShape, jobs: list[Job], usage: Usage,
                 headers: dict[str, str]) -> web.Response:
    timer = metrics.timer(route.name)

    async def collect(index: int, stream: ChoiceStream, scorer: Scorer) -> dict[str, Any]:
        chunks = timer.timed(stream.chunks())
        try:  # closing ``chunks`` cancels the generation
            done = [chunk async for chunk in chunks]
        finally:
            await chunks.aclose()
        return _whole_choice(shape, index, stream, scorer, done)

    tasks = [asyncio.ensure_future(collect(index, stream, scorer)) for index, (stream, scorer) in enumerate(jobs)]
    try:  # the first failure fails the request; leaving cancels every engine request
        choices = await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
    return web.json_response({**shape.whole(list(choices), usage()), "system_fingerprint": route.fingerprint},
                             headers=headers)


async def _streamed(request: web.Request, metrics: FrontendMetrics, route: Route, shape: ChoiceShape,
                    req: OpenAIRequest, jobs: list[Job], usage: Usage, headers: dict[str, str]) -> web.StreamResponse:
    """Every choice's chunks as they come, then the usage chunk (``include_usage``) and ``[DONE]``."""
    timer = metrics.timer(route.name)
    events: asyncio.Queue[dict[str, Any] | BaseException | None] = asyncio.Queue()
    fingerprint = {"system_fingerprint": route.fingerprint}

    def put(chunk: dict[str, Any]) -> None:  # ``continuous_usage_stats``: the running usage in every chunk
        running = {"usage": usage()} if req.continuous_usage else {}
        events.put_nowait({**fingerprint, **chunk, **running})

    async def produce(index: int, stream: ChoiceStream, scorer: Scorer) -> None:
        chunks = timer.timed(stream.chunks())
        opened = False

        def open_choice() -> None:  # the role (chat) and the echoed prompt, once the first response is in
            if shape.kind == "chat.completion":
                put(shape.chunk({"role": "assistant", "content": ""}, None, index=index))
            if scorer.echo_text:
                put(shape.chunk(scorer.echo_text, None, logprobs=scorer.prompt(stream.prompt_scored), index=index))

        try:
            async for chunk in chunks:
                if not opened:
                    opened = True
                    open_choice()
                put(shape.chunk(chunk.text, None, chunk.token_ids, scorer.tokens(chunk.scored), index=index))
            if not opened:
                open_choice()
            put(shape.chunk(None, stream.finish_reason, index=index))
            events.put_nowait(None)
        except Exception as exc:  # the request fails with its first failing choice
            events.put_nowait(exc)
        finally:
            await chunks.aclose()

    tasks = [asyncio.ensure_future(produce(index, stream, scorer)) for index, (stream, scorer) in enumerate(jobs)]
    try:
        first = await events.get()  # errors before the first chunk still get an HTTP status
        if isinstance(first, BaseException):
            raise first
        response = event_stream(headers)
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
        await response.write(DONE)
        return response
    finally:
        for task in tasks:
            task.cancel()
