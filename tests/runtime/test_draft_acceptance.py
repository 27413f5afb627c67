"""Rejection sampling keeps the target's distribution: on a small vocabulary the emitted tokens' frequencies pass a
chi-square test against p (fixed seed), for a one-hot draft (prompt lookup, a greedy draft model) and a sampled
draft's q; without the correction step (drawing from p again on a rejection) the same test fails."""

from __future__ import annotations

import pytest
import torch

from trtllm_kit.runtime.draft_acceptance import one_hot, rejection_sample, verify_token
from trtllm_kit.runtime.sampling import probabilities
from trtllm_kit.runtime.sequence import SamplingParams, Sequence

P = torch.tensor([0.05, 0.4, 0.1, 0.3, 0.15])
Q = torch.tensor([0.5, 0.1, 0.1, 0.2, 0.1])
DRAWS = 8_000
CHI2_BOUND = 18.47  # chi-square, 4 degrees of freedom, p = 0.001


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def emitted(q: torch.Tensor, generator: torch.Generator, corrected: bool = True) -> torch.Tensor:
    counts = torch.zeros(len(P))
    draws = torch.multinomial(q, DRAWS, replacement=True, generator=generator).tolist()
    for x in draws:
        token, accepted = rejection_sample(P, q, x, generator)
        if not accepted and not corrected:  # what the test must catch: a rejection redrawn from p itself
            token = int(torch.multinomial(P, 1, generator=generator))
        counts[token] += 1
    return counts


@pytest.mark.parametrize("draft", ["one-hot", "sampled q"])
def test_emitted_tokens_follow_the_target_distribution(draft):
    g = torch.Generator().manual_seed(11)
    if draft == "one-hot":  # a deterministic draft always proposes token 0 (p = 0.05): mostly rejected
        counts = torch.zeros(len(P))
        for _ in range(DRAWS):
            counts[rejection_sample(P, one_hot(0, len(P)), 0, g)[0]] += 1
    else:
        counts = emitted(Q, g)
    assert chi_square(counts, P) < CHI2_BOUND


def test_without_the_correction_step_the_distribution_is_off():
    g = torch.Generator().manual_seed(11)
    assert chi_square(emitted(Q, g, corrected=False), P) > 10 * CHI2_BOUND
    counts = torch.zeros(len(P))
    for _ in range(DRAWS):
        token, accepted = rejection_sample(P, one_hot(0, len(P)), 0, g)
        counts[token if accepted else int(torch.multinomial(P, 1, generator=g))] += 1
    assert chi_square(counts, P) > 10 * CHI2_BOUND


def test_a_draft_equal_to_the_target_is_always_accepted():
    g = torch.Generator().manual_seed(0)
    assert all(rejection_sample(P, P, x, g) == (x, True) for x in range(len(P)))


def test_a_sampled_sequence_emits_its_sampler_distribution_whatever_the_draft():
    """Through the sampler's processing (temperature 0.7, top-k 4 of 7 tokens): each emitted token's frequency
    follows the probabilities the sequence samples from, for a likely and an unlikely draft token."""
    row = torch.tensor([2.0, 0.5, 1.5, -1.0, 1.0, 0.0, -3.0])
    seq = Sequence(0, [1, 2, 3], SamplingParams(temperature=0.7, top_k=4, seed=5))
    target = probabilities(row, seq)
    assert target is not None and int((target > 0).sum()) == 4
    for draft in (0, 4):
        counts = torch.zeros(len(row))
        for _ in range(DRAWS // 4):
            token, accepted = verify_token(row, seq, draft)
            assert token is not None and accepted == (token == draft)
            counts[token] += 1
        kept = target > 0
        assert counts[~kept].sum() == 0
        expected = target[kept] * counts.sum()
        assert float(((counts[kept] - expected) ** 2 / expected).sum()) < 16.27  # 3 degrees of freedom, p = 0.001
