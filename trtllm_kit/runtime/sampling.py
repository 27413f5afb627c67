"""Choosing each sequence's next token from its logits: greedy, or temperature / top-k / top-p
(``runtime/truncation.py``) / min-p with its own seed. Before that, in this order: ``end_id`` is masked until the
output has its minimum length (``runtime/length.py``), the grammar's bitmask sets forbidden tokens to -inf, and the
penalties apply (``runtime/penalties.py``), as in vLLM's sampler.

A row whose numbers cannot be sampled (NaN or infinite probabilities, or none left above zero) fails its own
sequence, never the step: ``sample`` gives None for it and ``sampling_error`` says why. The greedy rows that nothing
changes take one argmax for the whole step.
"""

from __future__ import annotations

import torch

from trtllm_kit.runtime.penalties import apply_floor, apply_penalties
from trtllm_kit.runtime.sequence import Sequence
from trtllm_kit.runtime.truncation import truncate

NUMERICS_ERROR = ("the sampling probabilities of this request are not finite (NaN or inf) or all zero "
                  "(temperature {temperature}, {nucleus}); send a temperature of at least 1e-5, or 0 for greedy.")
# Greedy decoding takes the largest logit whatever the temperature: NaN logits come from the weights (the base's or
# an adapter's) overflowing in the served dtype, not from the request's sampling values.
GREEDY_NUMERICS_ERROR = ("the model's logits for this request are NaN under greedy decoding: its weights (or its "
                         "LoRA adapter's) overflow in the served dtype; serve a float32 build or check the adapter.")


def sample(logits: torch.Tensor, seqs: list[Sequence]) -> list[int | None]:
    """One token per sequence, None for one whose probabilities cannot be sampled; ``end_id`` is masked until the
    output has its minimum length.

    Arguments:
        logits: [len(seqs), vocab] float32 logits of each sequence's last position; seqs: the sequences.
    """
    tokens: list[int | None] = [None] * len(seqs)
    plain = [i for i, seq in enumerate(seqs) if _is_plain_greedy(seq)]
    if plain:  # one argmax for the rows nothing changes: the same first maximum as each row's own
        rows = logits if len(plain) == len(seqs) else logits[plain]
        best = rows.argmax(-1, keepdim=True)  # argmax propagates NaN: a row holds one iff its pick is one
        for i, token, is_nan in zip(plain, best.flatten().tolist(), rows.gather(1, best).isnan().flatten().tolist(),
                                    strict=True):
            tokens[i] = None if is_nan else token
    for i in sorted(set(range(len(seqs))) - set(plain)):
        tokens[i] = _sample_row(logits[i], seqs[i])
    return tokens


def sampling_error(seq: Sequence) -> str:
    """The sentence a sequence that ``sample`` gave None for is finished with.

    Arguments:
        seq: the sequence.
    """
    if seq.params.is_greedy:
        return GREEDY_NUMERICS_ERROR
    return NUMERICS_ERROR.format(temperature=seq.params.temperature, nucleus=seq.params.quoted)


def _sample_row(row: torch.Tensor, seq: Sequence) -> int | None:
    if seq.params.is_greedy:
        row = _processed(row, seq)
        return None if torch.isnan(row).any() else int(row.argmax())
    probs = probabilities(row, seq)
    return None if probs is None else int(torch.multinomial(probs, 1, generator=seq.generator))


def probabilities(row: torch.Tensor, seq: Sequence) -> torch.Tensor | None:
    """The distribution a sampling (not greedy) sequence draws its next token from, None when it cannot be sampled.

    Arguments:
        row: [vocab] float32 logits of the position; seq: the sequence, its tokens and grammar state up to there.
    """
    params = seq.params
    row = truncate(_processed(row, seq) / params.temperature, params)
    row = apply_floor(row, params)
    probs = torch.softmax(row, dim=-1)
    if not bool(torch.isfinite(probs).all()) or float(probs.sum()) <= 0:
        return None
    return probs


def _is_plain_greedy(seq: Sequence) -> bool:
    """A greedy sequence whose logits nothing changes before the argmax (no end mask, grammar or penalty)."""
    params = seq.params
    return params.is_greedy and seq.matcher is None and not params.changes_logits and _masked_end(seq) is None


def _masked_end(seq: Sequence) -> int | None:
    """The ``end_id`` masked now (the output is shorter than its minimum length), else None."""
    return None if seq.params.may_end(seq.num_output_tokens) else seq.params.end_id


def _processed(row: torch.Tensor, seq: Sequence) -> torch.Tensor:
    """The logits after the minimum length's end mask, the grammar's bitmask and the penalties."""
    params, end_id = seq.params, _masked_end(seq)
    if end_id is not None and 0 <= end_id < row.numel():
        row = row.clone()
        row[end_id] = float("-inf")
    if seq.matcher is not None:
        row = seq.matcher.mask(row)
    return apply_penalties(row, seq.token_ids[:seq.num_prompt_tokens], seq.output_ids, params)
