"""Logit penalties with vLLM's meanings, applied to one sequence's logits before temperature and sampling.

* ``repetition_penalty`` p (1 = off): every token seen in the prompt or the output has its logit divided by p
  when positive and multiplied by p otherwise (CTRL's penalty);
* ``frequency_penalty`` f and ``presence_penalty`` r (0 = off): a token generated c times loses ``f * c + r``
  (``r`` once it appeared at all); prompt tokens do not count, as in OpenAI's and vLLM's definition.
``min_p`` m (0 = off) keeps the tokens whose probability is at least ``m`` times the most likely one's.
"""

from __future__ import annotations

import torch


def apply_penalties(row: torch.Tensor, prompt_ids: list[int], output_ids: list[int], repetition_penalty: float,
                    presence_penalty: float, frequency_penalty: float) -> torch.Tensor:
    """A penalised copy of ``row`` (or ``row`` itself when every penalty is off).

    Arguments:
        row: [vocab] logits; prompt_ids, output_ids: the sequence's tokens; the penalties as above.
    """
    if repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(prompt_ids) | set(output_ids)), dtype=torch.long)
        values = row[seen]
        row = row.clone()
        row[seen] = torch.where(values > 0, values / repetition_penalty, values * repetition_penalty)
    if output_ids and (presence_penalty != 0.0 or frequency_penalty != 0.0):
        counts = torch.bincount(torch.tensor(output_ids), minlength=row.numel())[:row.numel()].to(row.dtype)
        row = row - frequency_penalty * counts - presence_penalty * (counts > 0).to(row.dtype)
    return row


def apply_min_p(row: torch.Tensor, min_p: float) -> torch.Tensor:
    """``row`` with the tokens below ``min_p`` times the top probability set to -inf.

    Arguments:
        row: [vocab] logits after temperature; min_p: in [0, 1] (0: unchanged).
    """
    if min_p <= 0:
        return row
    probs = torch.softmax(row, dim=-1)
    return row.masked_fill(probs < min_p * probs.max(), float("-inf"))
