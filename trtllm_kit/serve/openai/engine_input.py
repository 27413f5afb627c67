"""What a request gives the engine: each prompt as sent (text tokenized on the direct path to ``tensorrt_llm``) and
as ``echo`` shows it, its engine request, the tokens the gateway reserves for it, and the checks against the route
(the prompt's length, a response's logprob entries)."""

from __future__ import annotations

from typing import Any

from trtllm_kit.serve.http.errors import HTTPError
from trtllm_kit.serve.openai.request_limits import logprob_entries_problem
from trtllm_kit.serve.openai.routes import Route
from trtllm_kit.serve.openai.sampling_fields import OpenAIRequest, Prompt
from trtllm_kit.wire import GenerationRequest


def prompt_as_sent(route: Route, prompt: Prompt, req: OpenAIRequest) -> tuple[Prompt, str]:
    """The prompt as it is sent (text tokenized on the direct path), and as text (what ``echo`` shows); refuses
    logprobs off the direct path and a prompt too long for the model."""
    tokenizer = route.tokenizer
    prompt_text = prompt if isinstance(prompt, str) or tokenizer is None else tokenizer.decode(
        prompt, skip_special_tokens=req.skip_special_tokens)
    if route.tokenizes and tokenizer is not None and isinstance(prompt, str):
        # tokenized here, streamed as ids from tensorrt_llm and decoded here: one hop less than the BLS, exact
        # token counts, and a disconnect cancels the engine's request itself
        prompt = tokenizer.encode(prompt)
    scoring = req.scoring
    if scoring.logprobs is not None and not isinstance(prompt, tuple):
        raise HTTPError(f"logprobs needs the model's tokenizer and its tensorrt_llm model, and {route.name!r} is "
                        f"served through {route.triton_model!r} alone; leave logprobs out.", param="logprobs")
    if scoring.echo and scoring.logprobs is not None and route.context_logits is False:
        raise HTTPError(f"echo with logprobs scores the prompt, which {route.name!r} computes from its engine's "
                        "context logits, and its engine was built without them; rebuild with [build] "
                        "context_logits = true (--context-logits), or leave echo or logprobs out.", param="echo")
    check_length(route, prompt, req.max_tokens)
    return prompt, str(prompt_text)


def engine_request(route: Route, prompt: Prompt, req: OpenAIRequest, request_id: str,
                   **fields: Any) -> GenerationRequest:
    """The engine request of a prepared prompt (``OpenAIRequest.to_generation``) with what the route adds: for
    token ids the end id and the stop sequences as token ids (which the engine stops on; the frontend cuts the text),
    and whether prompt logprobs come from the engine's context logits. A guide is refused off the direct path (the
    BLS and ensemble take none).

    Arguments:
        route: where it goes; prompt: from ``prompt_as_sent``; req: the parsed request; request_id: the engine request's
        id; fields: further ``GenerationRequest`` fields (``seed``, ``n``, ``best_of``).
    """
    if req.guide is not None and not isinstance(prompt, tuple):
        raise HTTPError("structured output needs the model's tokenizer and its tensorrt_llm model, and this route "
                        "sends text to the BLS or ensemble; leave response_format and guided_* out.",
                        param="response_format")
    tokenizer = route.tokenizer if isinstance(prompt, tuple) else None
    return req.to_generation(prompt, request_id, eos_id=None if tokenizer is None else tokenizer.eos_id,
                             stop_words=() if tokenizer is None else tokenizer.words(req.stops),
                             context_logits=route.context_logits, **fields)


def most_prompt_tokens(route: Route, prompt: Prompt) -> int:
    """The prompt's tokens as preprocessing counts them; for text on a route without a tokenizer, its UTF-8 bytes
    (one token per byte at most, as byte-level tokenizers encode)."""
    if isinstance(prompt, tuple):
        return len(prompt)
    return len(prompt.encode()) if route.tokenizer is None else route.tokenizer.count(prompt)


def check_length(route: Route, prompt: Prompt, max_tokens: int) -> None:
    """Refuse a prompt that is, with ``max_tokens``, longer than the route's ``max_seq_len``."""
    limit, tokenizer = route.max_seq_len, route.tokenizer
    if limit is None:
        return
    if isinstance(prompt, tuple):
        num_prompt = len(prompt)
    elif tokenizer is not None:
        num_prompt = tokenizer.count(prompt)
    else:
        return
    if num_prompt + max_tokens > limit:
        raise HTTPError(f"this model's maximum context length is {limit} tokens; the request asks for "
                        f"{num_prompt} prompt + {max_tokens} completion tokens: shorten the prompt or lower "
                        "max_tokens.", param="max_tokens", code="context_length_exceeded")


def check_logprob_entries(route: Route, prompts: list[Prompt], req: OpenAIRequest) -> None:
    """Refuse a request whose response could hold more logprob entries than ``MAX_LOGPROB_ENTRIES``.

    Arguments:
        route: where it goes; prompts: its prompts as sent; req: the parsed request.
    """
    scoring = req.scoring
    if scoring.logprobs is None:
        return
    num_scored = len(prompts) * req.max_tokens
    if scoring.echo:
        num_scored += sum(most_prompt_tokens(route, prompt) for prompt in prompts)
    top_name = "logprobs" if req.kind == "text_completion" else "top_logprobs"
    problem = logprob_entries_problem(req.best_of or req.n, num_scored, scoring.logprobs, top_name)
    if problem is not None:
        raise HTTPError(problem, param=top_name)

