"""What speculation should gain: a model of the verify step's time, in units of one target decode step.

A step of a decoder over ``T`` tokens reads every weight once and does two FLOPs per weight and token, so it costs
``max(1, T / knee)`` of a one-token step: memory-bound up to ``knee`` tokens (the GPU's FLOPs per byte of memory
bandwidth, times the bytes per weight, over 2), compute-bound past it. Without a ``knee`` the step is taken as
memory-bound at every size (a small batch on a GPU).

With ``b`` sequences in the batch, K draft tokens per sequence, an acceptance length ``L`` (tokens emitted per
verifying step: 1 + accepted / drafts) and a draft whose step costs ``c`` of the target's (its weight bytes over
the target's when both are memory-bound; 0 for prompt lookup), a speculating step emits ``b L`` tokens for

    cost = step(b (K + 1)) + K c step(b)

and a plain step ``b`` tokens for ``step(b)``, so

    speedup = L step(b) / (step(b (K + 1)) + K c step(b))

which is ``L / (1 + K c)`` while memory-bound: speculation pays when ``L > 1 + K c``. With a per-token acceptance
rate ``a`` (each draft token kept with probability ``a`` given the ones before it were),
``L = (1 - a^(K + 1)) / (1 - a)``.

``plan`` reports the memory-bound figures (``speculation_report``): a draft model's ``c`` is its parameters over the
target's per tensor-parallel rank (the draft runs whole on every rank, the target's step is sharded ``tp`` ways);
prompt lookup, lookahead and heads the plan does not size count ``c = 0``. For a GPU whose knee is known
(``spec/roofline.py``) it adds the speedup at batch sizes 1, 4 and 16 and, per acceptance length, the smallest batch
size at which speculation stops paying. The speedup falls as ``b`` grows from ``knee / (K + 1)`` to ``knee`` and is
``L / (K + 1 + K c)`` past it, so a search up to the knee finds that batch size or shows there is none.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from trtllm_kit.errors import KitUsageError
from trtllm_kit.models.hf_config import HFConfig, read_hf_config
from trtllm_kit.spec.roofline import Roofline
from trtllm_kit.spec.speculative import Speculation, SpeculativeOptions
from trtllm_kit.spec.speculative_support import mtp_layers

REPORTED_LENGTHS = (1.5, 2.0, 3.0, 4.0)  # acceptance lengths ``plan`` predicts a speedup for (those up to K + 1)
BATCH_SIZES = (1, 4, 16)  # sequences per step ``plan`` predicts a speedup for when the GPU's knee is known
ROOFLINE_NOTE = ("a roofline model: weights read once a step and two FLOPs per weight and token at the datasheet's "
                 "dense peaks; no attention, no kernel efficiency")


def acceptance_length(acceptance_rate: float, draft_len: int) -> float:
    """Expected tokens per verifying step when each draft token is kept with probability ``acceptance_rate``.

    Arguments:
        acceptance_rate: a, in [0, 1]; draft_len: K, at least 1.
    """
    _check_draft_len(draft_len)
    if not 0.0 <= acceptance_rate <= 1.0:
        raise KitUsageError(f"acceptance rate {acceptance_rate} is not a probability; give a value in [0, 1].")
    if acceptance_rate == 1.0:
        return float(draft_len + 1)
    return (1 - acceptance_rate ** (draft_len + 1)) / (1 - acceptance_rate)


def step_cost(num_tokens: int, knee_tokens: float | None = None) -> float:
    """One forward step over ``num_tokens`` tokens, in one-token steps: ``max(1, num_tokens / knee_tokens)``.

    Arguments:
        num_tokens: tokens the step computes; knee_tokens: where the step turns compute-bound (None: never).
    """
    return 1.0 if knee_tokens is None else max(1.0, num_tokens / knee_tokens)


def predicted_speedup(acceptance_length: float, draft_len: int, draft_cost: float, batch_size: int = 1,
                      knee_tokens: float | None = None) -> float:
    """Tokens per unit of time with speculation over without: ``L step(b) / (step(b (K + 1)) + K c step(b))``.

    Arguments:
        acceptance_length: L, between 1 and K + 1; draft_len: K; draft_cost: c, a draft step over a target step
        (0 for prompt lookup); batch_size: b, sequences per step; knee_tokens: tokens at which a step turns
        compute-bound (None: memory-bound at every size).
    """
    _check_draft_len(draft_len)
    if not 1.0 <= acceptance_length <= draft_len + 1:
        raise KitUsageError(f"acceptance length {acceptance_length} is outside [1, K + 1 = {draft_len + 1}]; it counts "
                            "the tokens one verifying step emits (1 + accepted / drafts).")
    if draft_cost < 0 or batch_size < 1 or (knee_tokens is not None and knee_tokens < 1):
        raise KitUsageError(f"draft cost {draft_cost}, batch size {batch_size} or knee {knee_tokens} is out of range; "
                            "the draft cost must be at least 0, the batch size and knee at least 1.")
    plain = step_cost(batch_size, knee_tokens)
    speculating = step_cost(batch_size * (draft_len + 1), knee_tokens) + draft_len * draft_cost * plain
    return acceptance_length * plain / speculating


def stops_paying_at(acceptance_length: float, draft_len: int, draft_cost: float,
                    knee_tokens: float | None) -> int | None:
    """The smallest batch size whose predicted speedup is below 1; None when no batch size's is.

    Arguments:
        acceptance_length: L; draft_len: K; draft_cost: c; knee_tokens: where a step turns compute-bound (None:
        never, so every batch size has batch 1's speedup).
    """
    last = 1 if knee_tokens is None else math.ceil(knee_tokens) + 1  # constant past the knee
    for batch_size in range(1, last + 1):  # below 1 by more than float rounding (L = K + 1, c = 0: exactly 1 past it)
        if predicted_speedup(acceptance_length, draft_len, draft_cost, batch_size, knee_tokens) < 1 - 1e-9:
            return batch_size
    return None


def break_even_length(draft_len: int, draft_cost: float) -> float:
    """The acceptance length above which speculation pays while memory-bound: ``1 + K c``.

    Arguments:
        draft_len: K; draft_cost: c, a draft step over a target step.
    """
    _check_draft_len(draft_len)
    return 1 + draft_len * draft_cost


def _check_draft_len(draft_len: int) -> None:
    if draft_len < 1:
        raise KitUsageError(f"draft length {draft_len} is below 1; give K, the draft tokens per step.")


def speculation_report(options: SpeculativeOptions, hf: HFConfig, tp_size: int,
                       gpu_roofline: Roofline | None = None) -> dict[str, Any] | None:
    """``plan``'s speculation figures: K, the draft's cost ``c``, the break-even acceptance length and the predicted
    speedup at a few acceptance lengths, at batch 1 (memory-bound), and with a GPU the ``roofline`` entry
    (``roofline_report``); None without speculation.

    Arguments:
        options: the ``[speculative]`` table; hf: the target's config; tp_size: the target's tensor-parallel ranks;
        gpu_roofline: the build on the GPU the plan is for (None: no GPU known).
    """
    if options.mode is None:
        return None
    draft_len = mtp_layers(options, hf.raw) if options.mode is Speculation.MTP else options.draft_len
    cost = 0.0
    if options.mode is Speculation.DRAFT_TARGET and options.draft_model is not None:
        cost = read_hf_config(options.draft_model).num_parameters * tp_size / hf.num_parameters
    predicted: Mapping[str, float] = {f"{length:g}": round(predicted_speedup(length, draft_len, cost), 3)
                                      for length in REPORTED_LENGTHS if length <= draft_len + 1}
    report: dict[str, Any] = {"draft_len": draft_len, "draft_cost": round(cost, 4),
                              "break_even_acceptance_length": round(break_even_length(draft_len, cost), 4),
                              "predicted_speedup": dict(predicted)}
    if gpu_roofline is not None:
        report["roofline"] = roofline_report(gpu_roofline, draft_len, cost)
    return report


def roofline_report(gpu_roofline: Roofline, draft_len: int, draft_cost: float) -> dict[str, Any]:
    """The speedup at ``BATCH_SIZES`` by acceptance length and the batch size at which each stops paying, from the
    GPU's knee; both None, with ``unknown`` saying why, when the knee is not known.

    Arguments:
        gpu_roofline: the build on the GPU; draft_len: K; draft_cost: c.
    """
    knee = gpu_roofline.knee_tokens
    lengths = [length for length in REPORTED_LENGTHS if length <= draft_len + 1]
    by_batch = None if knee is None else {
        str(batch): {f"{length:g}": round(predicted_speedup(length, draft_len, draft_cost, batch, knee), 3)
                     for length in lengths} for batch in BATCH_SIZES}
    stops = None if knee is None else {f"{length:g}": stops_paying_at(length, draft_len, draft_cost, knee)
                                       for length in lengths}
    return {"gpu": gpu_roofline.gpu, "tensor_cores": gpu_roofline.tensor_cores, "peak_flops": gpu_roofline.peak_flops,
            "memory_bandwidth": gpu_roofline.memory_bandwidth, "bytes_per_weight": gpu_roofline.bytes_per_weight,
            "knee_tokens": None if knee is None else round(knee, 1), "predicted_speedup_by_batch_size": by_batch,
            "stops_paying_at_batch_size": stops, "unknown": gpu_roofline.unknown, "model": ROOFLINE_NOTE}
