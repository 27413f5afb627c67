"""A request of several choices (``n`` > 1 or several prompts): concurrent engine requests, one per choice, their
answers gathered in index order with the usage OpenAI counts (every prompt once, every completion)."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from dataclasses import replace
from typing import Any

from aiohttp import web

from trtllm_kit.serve.gateway.middleware import ADMIT
from trtllm_kit.serve.openai import prepare
from trtllm_kit.serve.openai.logprobs import Scorer, parse_scoring
from trtllm_kit.serve.openai.metrics import FrontendMetrics
from trtllm_kit.serve.openai.protocol import ChoiceShape, RequestError, Sampling, generation_request
from trtllm_kit.serve.openai.routes import Alias, Route
from trtllm_kit.serve.openai.run import Run


async def generate_choices(metrics: FrontendMetrics, request: web.Request, body: dict[str, Any], sampling: Sampling,
                           prompts: list[str | tuple[int, ...]], kind: str, route: Route,
                           alias: Alias | None) -> web.Response:
    """Several choices at once: ``n`` per prompt, choice ``prompt_index × n + j``, run as concurrent engine
    requests (each of a request's choices samples with its own seed); not streamed.

    Arguments:
        metrics: the frontend's metrics; request, body: the HTTP request and its JSON; sampling: its parsed
        sampling; prompts: its prompts; kind: ``text_completion`` or ``chat.completion``; route, alias: where it
        goes.
    """
    if sampling.stream:
        raise RequestError("stream with n > 1 or several prompts is not served yet; send stream false, or one "
                           "request per prompt and n 1.", param="stream")
    scoring = parse_scoring(body, kind)
    prepared = [prepare.prepared(route, prompt, sampling, scoring) for prompt in prompts]
    admit = request.get(ADMIT)
    if admit is not None:
        admit(sum(prepare.most_prompt_tokens(route, p) + sampling.max_tokens * sampling.n for p, _ in prepared))
    ident = f"{'cmpl' if kind == 'text_completion' else 'chatcmpl'}-{uuid.uuid4().hex}"
    base = random.getrandbits(63) if sampling.seed is None else sampling.seed
    jobs: list[tuple[Run, Scorer]] = []
    for i, (prompt, prompt_text) in enumerate(prepared):
        eos_id = route.tokenizer.eos_id if route.tokenizer is not None and isinstance(prompt, tuple) else None
        for j in range(sampling.n):
            own = replace(sampling, seed=(base + j) % 2**64)
            gen = replace(generation_request(prompt, own, f"{ident}-{i}-{j}", eos_id, logprobs=scoring.logprobs,
                                             prompt_logprobs=scoring.logprobs if scoring.echo else None),
                          guide=prepare.guide(body, prompt))
            jobs.append((Run(route, gen, own, show_ids=False),
                         Scorer(scoring, kind, route.tokenizer, sampling.skip_special_tokens, prompt_text)))

    def usage() -> dict[str, int]:  # every prompt counted once, every completion
        each = [run.usage() for run, _ in jobs]
        prompt_tokens = sum(u["prompt_tokens"] for u in each[::sampling.n])
        completion_tokens = sum(u["completion_tokens"] for u in each)
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens}

    request["usage"] = usage
    shape = ChoiceShape(kind, ident, route.name, int(time.time()))
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
                             headers=prepare.route_headers(route, alias))
