"""The rotary embedding's inverse frequencies, as transformers computes them for the rope types the kit runs.

``default`` is ``1 / base^(2i/dim)``; ``linear`` divides it by ``factor``; ``dynamic`` (NTK) raises the base once the
sequence outgrows ``max_position_embeddings``; ``llama3`` divides the low frequencies by ``factor``, keeps the high
ones and blends those between. The CPU runtime and calibration both read them here.
"""

from __future__ import annotations

import math
from typing import Any

import torch

ROPE_TYPES = ("default", "linear", "dynamic", "llama3")


def rope_type(scaling: dict[str, Any] | None) -> str:
    """The rope type a ``rope_scaling`` dict names (``default`` without one).

    Arguments:
        scaling: the HF ``rope_scaling`` (or TensorRT-LLM ``rotary_scaling``) dict, or None.
    """
    scaling = scaling or {}
    return str(scaling.get("rope_type", scaling.get("type", "default")))


def inv_freq(dim: int, base: float, scaling: dict[str, Any] | None, max_positions: int,
             seq_len: int) -> torch.Tensor:
    """Inverse frequencies [dim/2] in float32, step for step as transformers computes them.

    Arguments:
        dim: the rotary dimension; base: ``rope_theta``; scaling: the ``rope_scaling`` dict or None (its type one
        of ``ROPE_TYPES``); max_positions: ``max_position_embeddings``; seq_len: tokens in the sequence (only
        ``dynamic`` depends on it).
    """
    kind, s = rope_type(scaling), scaling or {}
    if kind == "dynamic" and seq_len > max_positions:
        factor = float(s["factor"])
        base *= (factor * seq_len / max_positions - (factor - 1)) ** (dim / (dim - 2))
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if kind == "linear":
        return freqs / float(s["factor"])
    if kind != "llama3":
        return freqs
    factor, low, high = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old_len = int(s.get("original_max_position_embeddings") or max_positions)
    wavelen = 2 * math.pi / freqs
    scaled = torch.where(wavelen > old_len / low, freqs / factor, freqs)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
    return torch.where(is_medium, smoothed, scaled)
