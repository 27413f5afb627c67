"""Choosing each sequence's next token from its logits: greedy, or temperature / top-k / top-p with its own seed."""

from __future__ import annotations

import torch

from trtllm_kit.runtime.sequence import Sequence


def sample(logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
    """One token per sequence; ``end_id`` is masked until ``min_tokens`` tokens exist.

    Arguments:
        logits: [len(seqs), vocab] float32 logits of each sequence's last position; seqs: the sequences.
    """
    tokens = []
    for row, seq in zip(logits, seqs, strict=True):
        params = seq.params
        if params.end_id is not None and seq.num_output_tokens < params.min_tokens and params.end_id < row.numel():
            row = row.clone()
            row[params.end_id] = float("-inf")
        if params.is_greedy:
            tokens.append(int(row.argmax()))
            continue
        row = row / params.temperature
        if params.top_k > 0:
            kth = torch.topk(row, min(params.top_k, row.numel())).values[-1]
            row = row.masked_fill(row < kth, float("-inf"))
        if 0 < params.top_p < 1:
            sorted_logits, order = torch.sort(row, descending=True)
            probs = torch.softmax(sorted_logits, dim=-1)
            drop = probs.cumsum(-1) - probs >= params.top_p  # keep the smallest prefix reaching top_p
            row = row.scatter(0, order[drop], float("-inf"))
        probs = torch.softmax(row, dim=-1)
        tokens.append(int(torch.multinomial(probs, 1, generator=seq.generator)))
    return tokens
