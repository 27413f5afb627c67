"""The sampling bounds the frontend's parse states beside the wire's rules (``trtllm_kit/wire/request.py``): a
seed is a 64-bit unsigned integer, 0 to ``MAX_SEED`` (2**64 - 1), larger refused, not wrapped. The greedy
temperature (``MIN_TEMPERATURE``, ``is_greedy_temperature``) and the logprob bound are the wire's, importable here.
"""

from __future__ import annotations

from trtllm_kit.wire.request import MAX_LOGPROBS, MIN_TEMPERATURE, is_greedy_temperature
from trtllm_kit.wire.rules import INT_RANGES

MAX_SEED = INT_RANGES["UINT64"][1]
__all__ = ["MAX_LOGPROBS", "MAX_SEED", "MIN_TEMPERATURE", "is_greedy_temperature"]
