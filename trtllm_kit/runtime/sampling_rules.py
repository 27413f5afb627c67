"""The sampling values every target accepts, stated once: the frontend, the CPU runtime and the llmapi model's
CPU class check requests against them before a value reaches an engine.

A temperature below ``MIN_TEMPERATURE`` divides logits into infinities (softmax then gives NaN), so it is taken
as greedy, as vLLM does below the same 1e-5. ``top_p`` must lie in (0, 1]. A seed is a 64-bit unsigned
integer: 0 to ``MAX_SEED`` (2**64 - 1); larger is refused, not wrapped.
"""

from __future__ import annotations

MIN_TEMPERATURE = 1e-5
MAX_SEED = 2**64 - 1


def is_greedy_temperature(temperature: float) -> bool:
    """Whether ``temperature`` means greedy decoding (0, or too small to divide logits by).

    Arguments:
        temperature: a non-negative temperature.
    """
    return temperature < MIN_TEMPERATURE


def sampling_problem(temperature: float | None, top_p: float | None,
                     seed: int | None) -> tuple[str, str] | None:
    """The field that is wrong and a sentence saying so, or None when an engine can run these values.

    Arguments:
        temperature, top_p, seed: the request's values (None: the default).
    """
    if temperature is not None and not 0 <= temperature <= 2:
        return "temperature", f"temperature must be between 0 and 2, got {temperature!r}."
    if top_p is not None and not 0 < top_p <= 1:
        return "top_p", f"top_p must be in (0, 1], got {top_p!r}."
    if seed is not None and not 0 <= seed <= MAX_SEED:
        return "seed", f"seed must be an integer from 0 to 2**64 - 1, got {seed}."
    return None
