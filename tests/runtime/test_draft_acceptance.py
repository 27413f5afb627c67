"""Rejection sampling keeps the target's distribution: on a small vocabulary the emitted tokens' frequencies pass a
chi-square test against p (fixed seed), for a one-hot draft (prompt lookup, a greedy draft model) and a sampled
draft's q; without the correction step (drawing from p again on a rejection) the same test fails."""

from __future__ import annotations

import pytest
import torch

from trtllm_kit.runtime.draft_acceptance import one_hot, rejection_sample

P = torch.tensor([0.05, 0.4, 0.1, 0.3, 0.15])
Q = torch.tensor([0.5, 0.1, 0.1, 0.2, 0.1])
DRAWS = 20_000
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
