"""A sequence's progress as the wire's ``GenerationResponse``: the tokens a response carries and what the request
asked to come with them (its sequence index, the token counts, logprobs with their alternatives, raw logits, the
timing and KV-block outputs), and its speculative decoding counts once it speculated. The prompt's logprobs and
logits come in each sequence's first response.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from trtllm_kit.runtime.sequence import Sequence, TokenLogprob
from trtllm_kit.wire import GenerationRequest, GenerationResponse, Perf, Scored


def scored_of(token_id: int, entry: TokenLogprob | None) -> Scored:
    """One position's scored token (no logprob without an entry: the first prompt token).

    Arguments:
        token_id: the token at the position; entry: its logprob and alternatives.
    """
    if entry is None:
        return (token_id, None, ())
    return (token_id, entry.logprob, tuple(zip(entry.top_ids, entry.top_logprobs, strict=True)))


def perf_of(seq: Sequence, tokens_per_block: int) -> Perf:
    """The timing (ns since the epoch) and KV-block outputs of ``seq`` now.

    Arguments:
        seq: the sequence; tokens_per_block: the KV cache's block size.
    """
    offset = time.time_ns() - time.perf_counter_ns()
    reused, total = seq.num_cached_tokens // tokens_per_block, -(-len(seq) // tokens_per_block)
    return Perf(arrival_time_ns=int(seq.arrival_time * 1e9) + offset,
                first_token_time_ns=int((seq.first_token_time or 0.0) * 1e9) + offset,
                last_token_time_ns=int(time.perf_counter() * 1e9) + offset, kv_cache_reused_blocks=reused,
                kv_cache_alloc_new_blocks=total - reused, kv_cache_alloc_total_blocks=total)


def response_of(seq: Sequence, req: GenerationRequest, token_ids: list[int], first: int, *, with_prompt: bool,
                perf: Perf | None = None) -> GenerationResponse:
    """The response carrying ``token_ids`` of ``seq``, whose generated tokens begin at output position ``first``.

    Arguments:
        seq: the sequence; req: its request; token_ids: the tokens the response carries; first: the first output
        position scored; with_prompt: the response carries the prompt's logprobs and logits (a sequence's first);
        perf: the timing and KV-block outputs, when asked for.
    """
    scored = prompt_scored = generation_logits = context_logits = None
    if req.logprobs is not None:
        scored = tuple(scored_of(e.token_id, e) for e in seq.output_logprobs[first:])
    if with_prompt and req.prompt_logprobs is not None:
        prompt = seq.token_ids[:seq.num_prompt_tokens]
        prompt_scored = tuple(scored_of(t, e) for t, e in zip(prompt, seq.prompt_logprobs, strict=True))
    if req.return_generation_logits:
        logits = seq.generation_logits[first:]
        generation_logits = torch.stack(logits).numpy() if logits else np.zeros((0, 0), np.float32)
    if with_prompt and req.return_context_logits:
        context_logits = torch.stack(seq.context_logits).numpy()
    return GenerationResponse(
        token_ids=tuple(token_ids), sequence_index=None if req.n is None else seq.index,
        num_input_tokens=seq.num_prompt_tokens if req.return_num_input_tokens else None,
        num_output_tokens=seq.num_output_tokens if req.return_num_output_tokens else None,
        cum_logprobs=(seq.cum_logprob,) if req.logprobs is not None else (),
        num_top=max(req.logprobs or 0, req.prompt_logprobs or 0), scored=scored, prompt_scored=prompt_scored,
        context_logits=context_logits, generation_logits=generation_logits, perf=perf,
        draft_acceptance=seq.draft_counts.acceptance())
