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
"""

from __future__ import annotations

from trtllm_kit.errors import KitUsageError


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


def step_cost(num_tokens: int, knee_tokens: int | None = None) -> float:
    """One forward step over ``num_tokens`` tokens, in one-token steps: ``max(1, num_tokens / knee_tokens)``.

    Arguments:
        num_tokens: tokens the step computes; knee_tokens: where the step turns compute-bound (None: never).
    """
    return 1.0 if knee_tokens is None else max(1.0, num_tokens / knee_tokens)


def predicted_speedup(acceptance_length: float, draft_len: int, draft_cost: float, batch_size: int = 1,
                      knee_tokens: int | None = None) -> float:
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
