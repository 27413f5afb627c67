"""Logit penalties with vLLM's meanings, applied to one sequence's logits before temperature and sampling.

* ``repetition_penalty`` p (1 = off): every token seen in the prompt or the output has its logit divided by p
  when positive and multiplied by p otherwise (CTRL's penalty);
* ``frequency_penalty`` f and ``presence_penalty`` r (0 = off): a token generated c times loses ``f * c + r``
  (``r`` once it appeared at all); prompt tokens do not count, as in OpenAI's and vLLM's definition.
``min_p`` m (0 = off) keeps the tokens whose probability is at least ``m`` times the most likely one's.

``Penalties`` holds these settings; the runtime's ``SamplingParams`` is one, so each is named here and in the wire's
row (``trtllm_kit.wire.request``, whose rule the runtime checks it by) and nowhere else in the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Penalties:
    """The logit penalties and the probability floor of one request, with vLLM's meanings (module docstring)."""

    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @property
    def changes_logits(self) -> bool:
        """Whether ``apply_penalties`` can change a row (a penalty is on)."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


def apply_penalties(row: torch.Tensor, prompt_ids: list[int], output_ids: list[int],
                    settings: Penalties) -> torch.Tensor:
    """A penalised copy of ``row`` (or ``row`` itself when every penalty is off).

    Arguments:
        row: [vocab] logits; prompt_ids, output_ids: the sequence's tokens; settings: the penalties.
    """
    repetition_penalty = settings.repetition_penalty
    presence_penalty, frequency_penalty = settings.presence_penalty, settings.frequency_penalty
    if repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(prompt_ids) | set(output_ids)), dtype=torch.long)
        values = row[seen]
        row = row.clone()
        row[seen] = torch.where(values > 0, values / repetition_penalty, values * repetition_penalty)
    if output_ids and (presence_penalty != 0.0 or frequency_penalty != 0.0):
        counts = torch.bincount(torch.tensor(output_ids), minlength=row.numel())[:row.numel()].to(row.dtype)
        row = row - frequency_penalty * counts - presence_penalty * (counts > 0).to(row.dtype)
    return row


def apply_floor(row: torch.Tensor, settings: Penalties) -> torch.Tensor:
    """``row`` with the tokens below ``min_p`` times the top probability set to -inf.

    Arguments:
        row: [vocab] logits after temperature; settings: ``min_p`` in [0, 1] (0: unchanged).
    """
    min_p = settings.min_p
    if min_p <= 0:
        return row
    probs = torch.softmax(row, dim=-1)
    return row.masked_fill(probs < min_p * probs.max(), float("-inf"))
