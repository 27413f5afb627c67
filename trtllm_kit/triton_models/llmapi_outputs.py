"""What the LLM API returned, as the wire's responses: a ``RequestOutput``'s completions (``CompletionOutput``) →
``GenerationResponse``.

Without ``sampling_param_n`` one response carries every completion's text (upstream's form); with it, each
completion that changed is a response of its own tagged with its ``sequence_index``. Streamed, a response carries
what is new (``*_diff``) and the prompt's logprobs come with a completion's first response.
"""

from __future__ import annotations

from typing import Any

from trtllm_kit.llmapi.disaggregated_params import handle_of
from trtllm_kit.wire import GenerationRequest, GenerationResponse, Scored


def scored_of(entries: list[Any], token_ids: list[int], k: int) -> tuple[Scored, ...]:
    """The scored tokens of the LLM API's ``{token_id: Logprob}`` dicts: each token's logprob (None where its
    position has no dict or the dict lacks it) and the alternatives ranked 1 to ``k``, best first.

    Arguments:
        entries: a dict (or None) per position; token_ids: the tokens scored; k: alternatives per position.
    """
    scored: list[Scored] = []
    for entry, token in zip(entries, token_ids, strict=False):
        ranked = sorted((entry or {}).items(), key=lambda item: item[1].rank or 0)
        best = tuple((int(t), float(p.logprob)) for t, p in ranked if (p.rank or 0) <= k)[:k]
        logprob = None if entry is None or token not in entry else float(entry[token].logprob)
        scored.append((int(token), logprob, best))
    return tuple(scored)


def completion_responses(req: GenerationRequest, output: Any, diff: bool,
                         reported: set[int]) -> list[GenerationResponse]:
    """The responses of ``output``: one with every completion, or with ``sampling_param_n`` one per completion that
    changed (or finished unreported).

    Arguments:
        req: the request; output: the ``RequestOutput``; diff: streamed (each response carries what is new);
        reported: indexes of the completions whose finish was sent, updated.
    """
    if req.n is None:
        return [response_of(req, output, output.outputs, diff, reported)]
    changed = [c for c in output.outputs if not diff or (c.token_ids_diff or c.text_diff)
               or (c.finish_reason is not None and c.index not in reported)]
    return [response_of(req, output, [c], diff, reported, is_indexed=True) for c in changed]


def response_of(req: GenerationRequest, output: Any, completions: list[Any], diff: bool, reported: set[int],
                is_indexed: bool = False) -> GenerationResponse:
    """One response of ``completions`` (the first gives the tokens, counts and logprobs).

    Arguments:
        req: the request; output: the ``RequestOutput``; completions: the ``CompletionOutput``s it reports;
        diff: streamed; reported: indexes of the completions whose finish was sent, updated; is_indexed: the
        response carries its completion's ``sequence_index``.
    """
    first = completions[0]
    is_first = not diff or len(first.token_ids_diff) == len(first.token_ids)  # its first response
    tokens = list(first.token_ids_diff if diff else first.token_ids)
    reported.update(c.index for c in completions if c.finish_reason is not None)
    scored = prompt_scored = None
    if req.logprobs is not None:
        scored = scored_of(list(first.logprobs_diff if diff else first.logprobs), tokens, req.logprobs)
    if req.prompt_logprobs is not None and is_first:
        prompt, entries = list(output.prompt_token_ids), list(first.prompt_logprobs or [])
        entries = [None] * (len(prompt) - len(entries)) + entries  # aligned on the last prompt token
        prompt_scored = scored_of(entries, prompt, req.prompt_logprobs)
    params = getattr(first, "disaggregated_params", None)
    return GenerationResponse(
        token_ids=tuple(tokens), texts=tuple(c.text_diff if diff else c.text for c in completions),
        sequence_index=first.index if is_indexed else None, num_input_tokens=len(output.prompt_token_ids),
        num_output_tokens=len(first.token_ids),
        cum_logprobs=tuple(float(c.cumulative_logprob or 0.0) for c in completions)
        if req.return_cumulative_logprob else (),
        num_top=req.logprobs or 0, num_prompt_top=req.prompt_logprobs, scored=scored, prompt_scored=prompt_scored,
        finish_reasons=tuple(str(c.finish_reason) for c in completions) if req.return_finish_reason else (),
        stop_reasons=tuple(str(c.stop_reason) for c in completions) if req.return_stop_reason else (),
        disaggregated=None if params is None else handle_of(params),
        draft_acceptance=getattr(first, "draft_acceptance", None))  # the CPU LLM's; TensorRT-LLM's has none
