"""The prompt's scored tokens computed from ``context_logits`` (the engine target, whose C++ backend has no
prompt-logprob output; the logprob outputs are read by the wire's response codecs).

Row ``i`` of the context logits scores prompt token ``i + 1``, so the first prompt token has no logprob."""

from __future__ import annotations

import numpy as np

# One scored token: its id, its logprob (None for the first prompt token) and the best alternatives (id, logprob).
from trtllm_kit.wire.response import Scored as Scored


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
