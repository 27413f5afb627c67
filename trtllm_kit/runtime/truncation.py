"""Truncation sampling with TensorRT-LLM's meanings, applied to one sequence's scaled logits (``runtime/sampling.py``).

* ``top_k`` k (0 = off) keeps the k most likely tokens;
* ``top_p`` p (0 or 1 = off) keeps the smallest set of most likely tokens whose probability reaches p.
Both off, or ``top_k`` 1, leaves one token: greedy decoding, however the logits are scaled.

``Truncation`` holds these settings; the runtime's ``SamplingParams`` is one, so each is named here and in the wire's
row (``trtllm_kit.wire.request``, whose rule the runtime checks it by) and nowhere else in the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Truncation:
    """The top-k and nucleus settings of one request, with TensorRT-LLM's meanings (module docstring)."""

    top_k: int = 0
    top_p: float = 0.0

    @property
    def keeps_one(self) -> bool:
        """Whether only the most likely token is left (``top_k`` 1, or both off): greedy decoding."""
        return self.top_k == 1 or (self.top_k == 0 and self.top_p == 0)

    @property
    def quoted(self) -> str:
        """The nucleus as a sentence about the request's numbers quotes it (``top_p 0.9``)."""
        return f"top_p {self.top_p}"


def truncate(row: torch.Tensor, settings: Truncation) -> torch.Tensor:
    """``row`` with the tokens outside the top ``k`` and outside the nucleus set to -inf (``row`` itself when both
    are off).

    Arguments:
        row: [vocab] scaled logits; settings: the top-k and nucleus settings.
    """
    if settings.top_k > 0:
        kth = torch.topk(row, min(settings.top_k, row.numel())).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    if 0 < settings.top_p < 1:
        sorted_logits, order = torch.sort(row, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        drop = probs.cumsum(-1) - probs >= settings.top_p  # keep the smallest prefix reaching the nucleus
        row = row.scatter(0, order[drop], float("-inf"))
    return row
