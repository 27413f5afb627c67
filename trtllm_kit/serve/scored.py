"""Scored tokens from a ``tensorrt_llm`` response: each token's logprob and its best alternatives, read from the
logprob outputs (``output_log_probs``, ``top_log_probs``, ``prompt_*``) or computed from ``context_logits`` (the
engine target, whose C++ backend has no prompt-logprob output).

Row ``i`` of the context logits scores prompt token ``i + 1``, so the first prompt token has no logprob."""

from __future__ import annotations

import numpy as np
from tritonclient.grpc import InferResult

# One scored token: its id, its logprob (None for the first prompt token) and the best alternatives (id, logprob).
Scored = tuple[int, float | None, tuple[tuple[int, float], ...]]


def tensor_scored(result: InferResult, prefix: str, token_ids: tuple[int, ...] | str) -> tuple[Scored, ...]:
    """The logprobs of ``token_ids`` from the ``output_*`` (``prefix`` "") or ``prompt_*`` outputs; the first
    prompt token has none.

    Arguments:
        result: one response; prefix: "" (generated tokens) or "prompt_"; token_ids: the tokens scored.
    """
    logprobs = result.as_numpy(f"{prefix or 'output_'}log_probs")
    if logprobs is None or isinstance(token_ids, str) or not token_ids:
        return ()
    logprobs = logprobs.reshape(-1)[-len(token_ids):]
    top_ids, top_logprobs = result.as_numpy(f"{prefix}top_log_prob_ids"), result.as_numpy(f"{prefix}top_log_probs")
    width = 0 if top_ids is None else top_ids.shape[-1]
    top_ids = np.zeros((len(token_ids), 0)) if top_ids is None else top_ids.reshape(-1, width)[-len(token_ids):]
    top_logprobs = np.zeros_like(top_ids) if top_logprobs is None else top_logprobs.reshape(-1, width)[
        -len(token_ids):]
    scored: list[Scored] = []
    for i, token in enumerate(token_ids):
        if prefix and i == 0:
            scored.append((token, None, ()))
            continue
        alternatives = tuple((int(a), float(b)) for a, b in zip(top_ids[i], top_logprobs[i], strict=True))
        scored.append((token, float(logprobs[i]), alternatives))
    return tuple(scored)


def logits_scored(logits: np.ndarray, prompt_ids: tuple[int, ...], num_top: int) -> tuple[Scored, ...]:
    """The prompt's logprobs from its context logits: the log-softmax of row ``i`` scores token ``i + 1``, with the
    ``num_top`` most likely tokens of that row, most likely first.

    Arguments:
        logits: ``[P, V]`` raw logits (any float type; computed in float64); prompt_ids: the P prompt tokens;
        num_top: alternatives per token (0 to 20).
    """
    rows = logits.reshape(len(prompt_ids), -1).astype(np.float64)
    shifted = rows - rows.max(axis=-1, keepdims=True)
    logprobs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    scored: list[Scored] = [(prompt_ids[0], None, ())]
    for i, token in enumerate(prompt_ids[1:]):
        row = logprobs[i]
        best = np.argsort(-row, kind="stable")[:num_top]
        scored.append((token, float(row[token]), tuple((int(t), float(row[t])) for t in best)))
    return tuple(scored)
