"""The penalties, min-p and ignore_eos equal a naive per-token reference on fixed logits; out-of-range values
are refused with a sentence naming the field."""

from __future__ import annotations

import math

import pytest
import torch

from trtllm_kit.errors import KitUsageError
from trtllm_kit.runtime.penalties import Penalties, apply_floor, apply_penalties
from trtllm_kit.runtime.sampling import sample
from trtllm_kit.runtime.sequence import SamplingParams, Sequence

LOGITS = [2.0, -1.0, 0.5, -3.0, 1.5, 0.0, -0.5, 4.0]
PROMPT, OUTPUT = [1, 2, 2], [4, 4, 4, 3, 2]


def naive_repetition(logits: list[float], seen: set[int], penalty: float) -> list[float]:
    return [(x / penalty if x > 0 else x * penalty) if i in seen else x for i, x in enumerate(logits)]


def naive_frequency_presence(logits: list[float], output: list[int], frequency: float,
                             presence: float) -> list[float]:
    return [x - frequency * output.count(i) - (presence if i in output else 0.0) for i, x in enumerate(logits)]


def naive_min_p(logits: list[float], min_p: float) -> list[float]:
    exps = [math.exp(x) for x in logits]
    probs = [e / sum(exps) for e in exps]
    return [x if p >= min_p * max(probs) else -math.inf for x, p in zip(logits, probs, strict=True)]


@pytest.mark.parametrize("penalty", [1.0, 1.3, 0.7])
def test_repetition_penalty_covers_prompt_and_output(penalty):
    got = apply_penalties(torch.tensor(LOGITS), PROMPT, OUTPUT, Penalties(repetition_penalty=penalty))
    assert got.tolist() == pytest.approx(naive_repetition(LOGITS, set(PROMPT + OUTPUT), penalty))


@pytest.mark.parametrize(("frequency", "presence"), [(0.5, 0.0), (0.0, 1.25), (-0.4, 0.7), (2.0, -2.0)])
def test_frequency_and_presence_count_output_tokens_only(frequency, presence):
    got = apply_penalties(torch.tensor(LOGITS), PROMPT, OUTPUT,
                          Penalties(presence_penalty=presence, frequency_penalty=frequency))
    assert got.tolist() == pytest.approx(naive_frequency_presence(LOGITS, OUTPUT, frequency, presence))
    assert got[1] == LOGITS[1]  # a prompt-only token is not penalised


def test_all_penalties_together_equal_the_references_in_order():
    got = apply_penalties(torch.tensor(LOGITS), PROMPT, OUTPUT,
                          Penalties(repetition_penalty=1.5, presence_penalty=0.3, frequency_penalty=0.2))
    expected = naive_frequency_presence(naive_repetition(LOGITS, set(PROMPT + OUTPUT), 1.5), OUTPUT, 0.2, 0.3)
    assert got.tolist() == pytest.approx(expected)


@pytest.mark.parametrize("min_p", [0.0, 0.05, 0.3, 1.0])
def test_min_p_keeps_tokens_above_a_fraction_of_the_best(min_p):
    got = apply_floor(torch.tensor(LOGITS), Penalties(min_p=min_p))
    assert got.tolist() == pytest.approx(naive_min_p(LOGITS, min_p))


def test_greedy_choice_follows_the_penalised_logits():
    """Token 7 is the raw argmax; a repetition penalty on it (it is in the output) hands the choice to token 0."""
    seq = Sequence(0, [7], SamplingParams(max_tokens=4, temperature=0.0, repetition_penalty=3.0))
    seq.token_ids.append(7)
    assert sample(torch.tensor([LOGITS]), [seq]) == [0]
    plain = Sequence(1, [7], SamplingParams(max_tokens=4, temperature=0.0))
    assert sample(torch.tensor([LOGITS]), [plain]) == [7]


def test_min_p_one_leaves_only_the_best_token_to_sample():
    seqs = [Sequence(i, [1], SamplingParams(temperature=1.0, top_p=1.0, min_p=1.0, seed=i)) for i in range(8)]
    assert sample(torch.tensor([LOGITS] * 8), seqs) == [7] * 8


@pytest.mark.parametrize(("field", "value"), [
    ("min_p", 1.5), ("min_p", -0.1), ("repetition_penalty", 0.0), ("presence_penalty", 2.5),
    ("frequency_penalty", -2.1), ("top_k", -1), ("min_tokens", -1), ("n", 0), ("logprobs", 21),
    ("prompt_logprobs", -1), ("min_p", float("nan")),
])
def test_out_of_range_values_are_refused_naming_the_field(field, value):
    with pytest.raises(KitUsageError, match=rf"^{field} must be"):
        SamplingParams(**{field: value})


def test_best_of_below_n_is_refused():
    with pytest.raises(KitUsageError, match=r"^best_of must be an integer >= n \(3\), got 2\.$"):
        SamplingParams(n=3, best_of=2)


@pytest.mark.parametrize(("ignore_eos", "reason", "kept"), [(False, "end_id", []), (True, None, [2])])
def test_ignore_eos_keeps_generating_past_end_id(ignore_eos, reason, kept):
    seq = Sequence(0, [1], SamplingParams(max_tokens=3, end_id=2, ignore_eos=ignore_eos))
    seq.append_token(2)
    assert (seq.finish_reason, seq.output_ids) == (reason, kept)
