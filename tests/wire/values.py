"""A representative value of every scalar field (exact in its tensor's type), for the codec round trips."""

from __future__ import annotations

from typing import Any

import numpy as np

VALUES: dict[str, Any] = {
    "max_tokens": 7, "streaming": True, "temperature": 0.5, "top_k": 3, "top_p": 0.75, "min_p": 0.125,
    "seed": 2**64 - 1, "min_tokens": 2, "end_id": 9, "priority": 0.25, "repetition_penalty": 1.5,
    "presence_penalty": -0.5, "frequency_penalty": 2.0, "n": 2, "best_of": 3, "beam_width": 1, "length_penalty": 1.0,
    "include_stop_str_in_output": True, "keep_end_token": True, "exclude_input_in_output": False,
    "return_num_input_tokens": True, "return_num_output_tokens": False, "return_perf_metrics": True,
    "return_context_logits": True, "return_generation_logits": True, "return_finish_reason": True,
    "return_stop_reason": True, "return_cumulative_logprob": True,
}


def batched(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The arrays as a batched model receives them (a leading batch dimension of 1)."""
    return {name: array[None] for name, array in arrays.items()}
