"""A sequence's logprobs and logits as the ``tensorrt_llm`` model's output arrays (names and shapes of
``model_repo/tensors.py``, batch dimension included), for the CPU model in that slot.

Upstream's ``output_log_probs`` [1, 1, T], ``cum_log_probs`` [1, 1], ``generation_logits`` [1, 1, T, V] and
``context_logits`` [1, P, V]; the kit's ``top_log_probs`` / ``top_log_prob_ids`` [1, 1, T, k] and
``prompt_log_probs`` [1, P], ``prompt_top_log_probs`` / ``prompt_top_log_prob_ids`` [1, P, k]. The first prompt
token has no logprob: its entries are 0 and its ids -1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from trtllm_kit.runtime.sequence import Sequence, TokenLogprob


@dataclass(frozen=True)
class LogprobRequest:
    """What a request asked for: ``return_log_probs``, ``return_prompt_log_probs`` and ``num_top_log_probs``."""

    log_probs: bool = False
    prompt_log_probs: bool = False
    num_top: int = 0


def top_arrays(entries: list[TokenLogprob | None], k: int) -> tuple[np.ndarray, np.ndarray]:
    """[len(entries), k] alternatives' logprobs and ids; an entry without data gives 0 and -1.

    Arguments:
        entries: positions; k: alternatives per position.
    """
    values, ids = np.zeros((len(entries), k), np.float32), np.full((len(entries), k), -1, np.int32)
    for row, entry in enumerate(entries):
        if entry is not None and entry.top_ids:
            values[row], ids[row] = entry.top_logprobs[:k], entry.top_ids[:k]
    return values, ids


def logprob_arrays(seq: Sequence, wanted: LogprobRequest, first: int, with_prompt: bool) -> dict[str, np.ndarray]:
    """The logprob and logits outputs of ``seq``'s generated tokens from ``first`` on, and of its prompt.

    Arguments:
        seq: the sequence; wanted: the request's logprob inputs; first: the first output position in the
        response; with_prompt: whether the response carries the prompt's outputs (each sequence's first one).
    """
    arrays, params, k = {}, seq.params, wanted.num_top
    if wanted.log_probs:
        entries = seq.output_logprobs[first:]
        arrays["output_log_probs"] = np.array([[[e.logprob for e in entries]]], np.float32)
        arrays["cum_log_probs"] = np.array([[seq.cum_logprob]], np.float32)
        if k:
            values, ids = top_arrays(list(entries), k)
            arrays["top_log_probs"], arrays["top_log_prob_ids"] = values[None, None], ids[None, None]
    if params.return_generation_logits:
        logits = seq.generation_logits[first:]
        stacked = torch.stack(logits).numpy() if logits else np.zeros((0, 0), np.float32)
        arrays["generation_logits"] = stacked.astype(np.float32)[None, None]
    if with_prompt and wanted.prompt_log_probs:
        arrays["prompt_log_probs"] = np.array([[0.0 if e is None else e.logprob for e in seq.prompt_logprobs]],
                                              np.float32)
        if k:
            values, ids = top_arrays(seq.prompt_logprobs, k)
            arrays["prompt_top_log_probs"], arrays["prompt_top_log_prob_ids"] = values[None], ids[None]
    if with_prompt and params.return_context_logits:
        arrays["context_logits"] = torch.stack(seq.context_logits).numpy()[None]
    return arrays
