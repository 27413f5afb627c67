"""The sampling facts every target shares beyond the wire's rules (``trtllm_kit/wire/request.py``): the frontend,
the CPU runtime and the llmapi model's CPU class take them from here.

A temperature below ``MIN_TEMPERATURE`` divides logits into infinities (softmax then gives NaN), so it is taken
as greedy, as vLLM does below the same 1e-5. A seed is a 64-bit unsigned integer: 0 to ``MAX_SEED``
(2**64 - 1); larger is refused, not wrapped.
"""

from __future__ import annotations

from trtllm_kit.wire.request import MAX_LOGPROBS
from trtllm_kit.wire.rules import INT_RANGES

MIN_TEMPERATURE = 1e-5
MAX_SEED = INT_RANGES["UINT64"][1]
__all__ = ["MAX_LOGPROBS", "MAX_SEED", "MIN_TEMPERATURE", "is_greedy_temperature"]


def is_greedy_temperature(temperature: float) -> bool:
    """Whether ``temperature`` means greedy decoding (0, or too small to divide logits by).

    Arguments:
        temperature: a non-negative temperature.
    """
    return temperature < MIN_TEMPERATURE
