"""Llama 3's RoPE scaling recovered from a GGUF's ``rope_freqs.weight``.

llama.cpp does not write Llama 3's ``rope_scaling`` parameters; it writes their effect, one divisor per rotary
frequency: 1 for short wavelengths, ``factor`` for long ones, and between them ``1 / ((1 - s) / factor + s)`` where
``s = original / wavelength / (high - low) - low / (high - low)`` is linear in 1 / wavelength. The two coefficients
of that line are all the divisors depend on, so fixing ``low_freq_factor`` at 1 gives parameters that reproduce the
file's divisors; they are checked against every divisor before they are used.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from trtllm_kit.errors import ModelError
from trtllm_kit.models.gguf.header import GGUFHeader
from trtllm_kit.models.gguf.tensor_data import read_tensor

RELATIVE_TOLERANCE = 1e-4


def llama3_divisors(rope_scaling: dict[str, Any], theta: float, head_dim: int) -> np.ndarray:
    """The divisor of each rotary frequency that Llama 3's rule gives (what llama.cpp writes as ``rope_freqs``).

    Arguments:
        rope_scaling: ``factor``, ``low_freq_factor``, ``high_freq_factor``, ``original_max_position_embeddings``;
        theta: the RoPE base; head_dim: the rotated dimensions.
    """
    factor, low, high = rope_scaling["factor"], rope_scaling["low_freq_factor"], rope_scaling["high_freq_factor"]
    original = rope_scaling["original_max_position_embeddings"]
    wavelengths = 2 * math.pi * theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    smooth = (original / wavelengths - low) / (high - low)
    divisors = 1.0 / ((1 - smooth) / factor + smooth)
    divisors[wavelengths < original / high] = 1.0
    divisors[wavelengths > original / low] = factor
    return divisors


def llama3_rope_scaling(header: GGUFHeader, head_dim: int) -> dict[str, Any] | None:
    """``rope_scaling`` for the file's ``rope_freqs.weight`` (None when every divisor is 1).

    Arguments:
        header: the file's header (the tensor is read from its file); head_dim: the rotated dimensions.
    """
    tensor = header.tensors["rope_freqs.weight"]
    fd = os.open(header.path, os.O_RDONLY)
    try:
        divisors = read_tensor(header, tensor, fd).double().numpy()
    finally:
        os.close(fd)
    if divisors.shape != (head_dim // 2,):
        raise ModelError(f"{header.path}: rope_freqs.weight has shape {list(divisors.shape)}, not [{head_dim // 2}] "
                         "(one divisor per rotary frequency); the file is damaged: download or convert it again.")
    theta = float(header.metadata.get(f"{header.architecture}.rope.freq_base", 10000.0))
    factor = float(divisors.max())
    if math.isclose(factor, 1.0) and math.isclose(float(divisors.min()), 1.0):
        return None
    wavelengths = 2 * math.pi * theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    between = (divisors > 1 + RELATIVE_TOLERANCE) & (divisors < factor * (1 - RELATIVE_TOLERANCE))
    if between.sum() >= 2:  # s = a / wavelength - b, fitted where the divisor is neither 1 nor factor
        smooth = (factor / divisors[between] - 1) / (factor - 1)
        design = np.stack([1 / wavelengths[between], -np.ones(int(between.sum()))], axis=1)
        (a, b), *_ = np.linalg.lstsq(design, smooth, rcond=None)
    else:  # a step: put both boundaries between the last divisor of 1 and the first that is not
        step = int(np.argmax(divisors > 1 + RELATIVE_TOLERANCE))
        edge = math.sqrt(wavelengths[max(step - 1, 0)] * wavelengths[step])
        a, b = edge * 1e6, 1e6 - 1  # s falls from above 1 to below 0 within a part in a million around the edge
    if b <= 0:
        raise _not_llama3(header)
    original = a / b
    scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 1.0 + 1.0 / b,
               "original_max_position_embeddings": round(original) if abs(original - round(original)) < 1e-3
               else original}
    if not np.allclose(llama3_divisors(scaling, theta, head_dim), divisors, rtol=RELATIVE_TOLERANCE, atol=0):
        raise _not_llama3(header)
    return scaling


def _not_llama3(header: GGUFHeader) -> ModelError:
    return ModelError(f"{header.path}: rope_freqs.weight does not follow Llama 3's RoPE scaling rule, the only one "
                      "the kit imports from frequency divisors.")
