"""Scored tokens as logprob tensors and back, the same in both dialects: per position the scored token's logprob
(``*log_probs``) and its ``k`` best alternatives (``*top_log_probs`` / ``*top_log_prob_ids``, most likely first).

A position without a logprob (the first prompt token) is 0 with alternatives 0 and id -1; shorter alternative
rows are padded the same way, and a reader drops the ids -1 (no token has it).

The engine target's C++ backend has no prompt-logprob output: its prompt's scored tokens are computed from
``context_logits`` (``logits_scored``), where row ``i`` scores prompt token ``i + 1``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from trtllm_kit.wire.response import Scored
from trtllm_kit.wire.rules import WireError


def scored_arrays(scored: tuple[Scored, ...], k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[T] logprobs, [T, k] alternatives' logprobs and [T, k] their ids.

    Arguments:
        scored: the positions; k: alternatives per position.
    """
    logprobs = np.array([0.0 if logprob is None else logprob for _, logprob, _ in scored], np.float32)
    values, ids = np.zeros((len(scored), k), np.float32), np.full((len(scored), k), -1, np.int32)
    for row, (_, _, alternatives) in enumerate(scored):
        for col, (token_id, logprob) in enumerate(alternatives[:k]):
            ids[row, col], values[row, col] = token_id, logprob
    return logprobs, values, ids


def read_scored(arrays: Mapping[str, np.ndarray], prefix: str, token_ids: tuple[int, ...],
                is_prompt: bool) -> tuple[tuple[Scored, ...], int] | None:
    """The scored tokens of ``{prefix}log_probs`` and the alternatives' tensors, aligned on the last of
    ``token_ids``, and the number of alternatives per position (None when the response carries no logprobs).

    Arguments:
        arrays: the response's tensors; prefix: ``output_`` or ``prompt_``; token_ids: the tokens scored;
        is_prompt: the first position is the first prompt token (no logprob).
    """
    name = f"{prefix}log_probs"
    if name not in arrays:
        return None
    top = "top_" if prefix == "output_" else f"{prefix}top_"
    logprobs = np.asarray(arrays[name], np.float64).reshape(-1)
    ids_array, values_array = arrays.get(f"{top}log_prob_ids"), arrays.get(f"{top}log_probs")
    k = 0 if ids_array is None else int(np.asarray(ids_array).shape[-1])
    count = len(token_ids)
    if logprobs.size < count:
        raise WireError(name, f"{name} holds {logprobs.size} logprobs for {count} tokens; a response scores every "
                              "token it carries.")
    logprobs = logprobs[logprobs.size - count:]
    if ids_array is None or values_array is None or k == 0:
        top_ids, top_values = np.zeros((count, 0), np.int64), np.zeros((count, 0))
    else:
        top_ids = np.asarray(ids_array).reshape(-1, k)
        top_values = np.asarray(values_array, np.float64).reshape(-1, k)
        if len(top_ids) < count or top_values.shape != top_ids.shape:
            raise WireError(f"{top}log_probs", f"{top}log_probs and {top}log_prob_ids hold {len(top_ids)} rows for "
                                               f"{count} tokens; send [tokens, k] rows of both.")
        top_ids, top_values = top_ids[len(top_ids) - count:], top_values[len(top_values) - count:]
    scored: list[Scored] = []
    for i, token in enumerate(token_ids):
        if is_prompt and i == 0:
            scored.append((token, None, ()))
            continue
        alternatives = tuple((int(t), float(v)) for t, v in zip(top_ids[i], top_values[i], strict=True) if t >= 0)
        scored.append((token, float(logprobs[i]), alternatives))
    return tuple(scored), k


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
