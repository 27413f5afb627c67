"""The model of speculation's speedup (``spec/speculative_speedup.py``) against values computed by hand."""

from __future__ import annotations

import pytest

from trtllm_kit.errors import KitUsageError
from trtllm_kit.spec.speculative_speedup import (
    acceptance_length,
    break_even_length,
    predicted_speedup,
    step_cost,
)


@pytest.mark.parametrize(("rate", "draft_len", "expected"), [
    (0.8, 4, 3.3616),  # (1 - 0.8^5) / 0.2 = (1 - 0.32768) / 0.2
    (0.5, 3, 1.875),  # 1 + 0.5 + 0.25 + 0.125
    (0.0, 4, 1.0),  # nothing kept: the target's own token alone
    (1.0, 4, 5.0),  # everything kept: K + 1
])
def test_acceptance_length_of_a_per_token_rate(rate: float, draft_len: int, expected: float) -> None:
    assert acceptance_length(rate, draft_len) == pytest.approx(expected)


@pytest.mark.parametrize(("length", "draft_len", "cost", "batch", "knee", "expected"), [
    (3.0, 4, 0.0, 1, None, 3.0),  # prompt lookup, memory-bound: L
    (3.0, 4, 0.1, 1, None, 3.0 / 1.4),  # a draft a tenth of the target: L / (1 + K c)
    (1.02, 4, 0.2, 1, None, 1.02 / 1.8),  # a draft that rarely agrees loses: 0.567
    (3.0, 4, 0.0, 64, 128, 3.0 / 2.5),  # 64 x 5 = 320 tokens verified: 2.5 steps for 3 x 64 tokens
    (3.0, 4, 0.0, 256, 128, 3.0 * 2 / 10),  # compute-bound already: 1280 tokens cost 10 steps, plain 256 cost 2
    (5.0, 4, 0.0, 16, 128, 5.0),  # 16 x 5 = 80 tokens: still memory-bound
])
def test_predicted_speedup_against_hand_computed_values(length: float, draft_len: int, cost: float, batch: int,
                                                         knee: int | None, expected: float) -> None:
    assert predicted_speedup(length, draft_len, cost, batch, knee) == pytest.approx(expected)


def test_speculation_pays_exactly_above_the_break_even_length() -> None:
    even = break_even_length(4, 0.25)
    assert even == 2.0
    assert predicted_speedup(even, 4, 0.25) == pytest.approx(1.0)
    assert predicted_speedup(even + 0.1, 4, 0.25) > 1.0 > predicted_speedup(even - 0.1, 4, 0.25)


def test_a_step_costs_one_until_the_knee() -> None:
    assert [step_cost(n, 100) for n in (1, 100, 250)] == [1.0, 1.0, 2.5]
    assert step_cost(10_000) == 1.0


@pytest.mark.parametrize(("call", "message"), [
    (lambda: predicted_speedup(6.0, 4, 0.0),
     "acceptance length 6.0 is outside [1, K + 1 = 5]; it counts the tokens one verifying step emits (1 + accepted / "
     "drafts)."),
    (lambda: acceptance_length(1.5, 4), "acceptance rate 1.5 is not a probability; give a value in [0, 1]."),
    (lambda: break_even_length(0, 0.1), "draft length 0 is below 1; give K, the draft tokens per step."),
    (lambda: predicted_speedup(2.0, 4, -0.1),
     "draft cost -0.1, batch size 1 or knee None is out of range; the draft cost must be at least 0, the batch size "
     "and knee at least 1."),
])
def test_values_outside_the_model_are_refused_in_one_sentence(call, message: str) -> None:
    with pytest.raises(KitUsageError) as refused:
        call()
    assert str(refused.value) == message
