"""Which token a speculating sequence emits at a verified position: the target's own choice, compared with the
draft (greedy), or rejection sampling against the draft's distribution (sampling), so the emitted tokens follow
the target's distribution exactly (Leviathan et al. 2023; Chen et al. 2023)."""

from __future__ import annotations

import torch

from trtllm_kit.runtime.sampling import probabilities, sample
from trtllm_kit.runtime.sequence import Sequence


def rejection_sample(target: torch.Tensor, draft: torch.Tensor, token_id: int,
                     generator: torch.Generator | None = None) -> tuple[int, bool]:
    """Accept the draft's ``token_id`` with probability min(1, p(x) / q(x)), else draw from normalize(max(0, p - q));
    returns the token and whether it is the draft's.

    Arguments:
        target: [vocab] the target's probabilities p; draft: [vocab] the draft's q (one-hot for a deterministic
        draft: accept with p(x), else draw from p without x); token_id: the drafted token x; generator: the
        sequence's random stream.
    """
    p, q = float(target[token_id]), float(draft[token_id])
    if q > 0 and float(torch.rand(1, generator=generator)) < min(1.0, p / q):
        return token_id, True
    residual = (target - draft).clamp(min=0)
    if float(residual.sum()) <= 0:  # p == q: the draft is always accepted
        return token_id, True
    return int(torch.multinomial(residual / residual.sum(), 1, generator=generator)), False


def one_hot(token_id: int, vocab_size: int) -> torch.Tensor:
    """The distribution of a deterministic draft (prompt lookup, a greedy draft model).

    Arguments:
        token_id: the drafted token; vocab_size: the vocabulary's size.
    """
    q = torch.zeros(vocab_size)
    q[token_id] = 1.0
    return q


def verify_token(row: torch.Tensor, seq: Sequence, draft_id: int | None) -> tuple[int | None, bool]:
    """The token ``seq`` emits from the target's ``row`` where its draft proposed ``draft_id`` (None: no draft left,
    the bonus position), and whether that is the draft's; None when the row cannot be sampled.

    Arguments:
        row: [vocab] the target's raw logits at the position; seq: the sequence, its accepted tokens appended;
        draft_id: the drafted token at the position.
    """
    if draft_id is None or seq.params.is_greedy:
        token = sample(row[None], [seq])[0]
        return token, token is not None and token == draft_id
    probs = probabilities(row, seq)
    if probs is None:
        return None, False
    return rejection_sample(probs, one_hot(draft_id, probs.numel()), draft_id, seq.generator)
