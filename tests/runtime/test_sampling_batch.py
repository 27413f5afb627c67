"""The step's one argmax for plain greedy rows gives each row the token its own processing gives: rows with a
penalty, a masked ``end_id`` or sampling keep theirs, ties take the first maximum, a NaN row gives None."""

from __future__ import annotations

import torch

from trtllm_kit.runtime.penalties import apply_penalties
from trtllm_kit.runtime.sampling import sample
from trtllm_kit.runtime.sequence import SamplingParams, Sequence

VOCAB = 16


def sequence(seq_id: int, params: SamplingParams, output_ids: list[int]) -> Sequence:
    seq = Sequence(seq_id, [1, 2, 3], params)
    for token_id in output_ids:
        seq.append_token(token_id)
    return seq


def test_each_row_gets_the_token_of_its_own_processing() -> None:
    logits = torch.randn(6, VOCAB, generator=torch.Generator().manual_seed(0))
    logits[0, 7] = logits[0, 3] = logits[0].max() + 1.0  # a tie: the first maximum
    logits[1, 9] = logits[1].max() + 0.5  # the maximum, which the repetition penalty then lowers below another
    logits[1, 4] = logits[1, 9] - 0.1
    logits[2, 5] = logits[2].max() + 1.0  # end_id, masked until min_tokens tokens exist
    logits[4, 2] = float("nan")
    logits[5, 5] = logits[5].max() + 1.0  # end_id again, no longer masked: min_tokens is reached
    seqs = [sequence(0, SamplingParams(max_tokens=8), []),
            sequence(1, SamplingParams(max_tokens=8, repetition_penalty=2.0), [9]),
            sequence(2, SamplingParams(max_tokens=8, min_tokens=4, end_id=5), [6]),
            sequence(3, SamplingParams(max_tokens=8, temperature=0.7, top_k=1), []),
            sequence(4, SamplingParams(max_tokens=8), []),
            sequence(5, SamplingParams(max_tokens=8, end_id=5, min_tokens=1), [6])]
    penalised = apply_penalties(logits[1], [1, 2, 3], [9], seqs[1].params)
    masked = logits[2].clone()
    masked[5] = float("-inf")
    assert sample(logits, seqs) == [3, int(penalised.argmax()), int(masked.argmax()), int(logits[3].argmax()), None,
                                    int(logits[5].argmax())]
    assert int(penalised.argmax()) == 4 and int(masked.argmax()) != 5 and int(logits[5].argmax()) == 5


def test_a_step_of_only_plain_greedy_rows_equals_the_rows_one_by_one() -> None:
    logits = torch.randn(8, VOCAB, generator=torch.Generator().manual_seed(1))
    seqs = [sequence(i, SamplingParams(max_tokens=4), []) for i in range(8)]
    assert sample(logits, seqs) == [int(row.argmax()) for row in logits]


def test_a_plain_greedy_row_with_a_nan_anywhere_gives_none() -> None:
    logits = torch.randn(7, VOCAB, generator=torch.Generator().manual_seed(2))
    logits[6, 3] = logits[6].max() + 1.0
    for row, column in ((0, 0), (1, VOCAB - 1), (2, int(logits[2].argmax())), (3, int(logits[3].argmin()))):
        logits[row, column] = float("nan")
    logits[4, 1] = float("inf")  # the maximum, not NaN
    logits[5] = float("-inf")  # nothing above -inf: the first column, as a row's own argmax
    logits[6, 9] = float("nan")  # after the maximum
    seqs = [sequence(i, SamplingParams(max_tokens=4), []) for i in range(7)]
    assert sample(logits, seqs) == [None, None, None, None, 1, 0, None]
