"""FP8 (e4m3) per-tensor quantization (``docs/trtllm-checkpoint.md`` §5.5).

``weights_scaling_factor = amax|W| / 448`` and ``activation_scaling_factor = amax|X| / 448`` (float32 ``[1]``);
fused layers (q/k/v; fc/gate) share the largest scale; weights are clamped to ±448 before the cast, because the
cast turns values of 480 and more into NaN (e4m3fn has no infinity).
"""

from __future__ import annotations

import torch

from trtllm_kit.quant.blocks import BlockBuffer

FP8_MAX = 448.0
FP8_DTYPE = torch.float8_e4m3fn
MIN_SCALE = 1e-12  # an all-zero tensor gets this scale instead of 0 (its values quantize to 0 either way)


def fp8_scale(amax: float) -> float:
    """``amax / 448`` (a zero amax gives a tiny positive scale, so that dividing by it stays finite).

    Arguments:
        amax: the largest absolute value.
    """
    return max(float(amax) / FP8_MAX, MIN_SCALE)


def fp8_scale_tensor(amax: float) -> torch.Tensor:
    """The float32 ``[1]`` scaling-factor tensor for ``amax``.

    Arguments:
        amax: the largest absolute value.
    """
    return torch.tensor([fp8_scale(amax)], dtype=torch.float32)


def fp8_quantize(weight: torch.Tensor, scale: float, buffer: BlockBuffer | None = None) -> torch.Tensor:
    """``clamp(W / scale, -448, 448).to(float8_e4m3fn)``, a block of rows at a time.

    Arguments:
        weight: any shape, any float dtype; scale: the per-tensor dequantization scale; buffer: a reused buffer.
    """
    buffer = buffer or BlockBuffer()
    divisor = torch.tensor(scale, dtype=torch.float32)  # the value the [1] float32 scale tensor holds
    out = torch.empty(weight.shape, dtype=FP8_DTYPE)

    def math(block: torch.Tensor, _rows: slice) -> None:
        block.div_(divisor).clamp_(-FP8_MAX, FP8_MAX)

    buffer.map_rows(weight, out, math)
    return out


def fp8_dequantize(q: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """``q.float() * scale`` in float32.

    Arguments:
        q: float8_e4m3fn values; scale: the dequantization scale.
    """
    return q.float() * scale


def fp8_rescale(weight: torch.Tensor, scale: torch.Tensor, max_scale: torch.Tensor,
                dtype: torch.dtype) -> torch.Tensor:
    """e4m3 values quantized with ``scale`` requantized to the larger ``max_scale`` of their fused group, as
    TensorRT-LLM's loader does for a fused q/k/v or gate/up linear (``FP8QDQLinearMethod.rescale_fused_weights``):
    ``W · scale / max_scale`` in the model dtype, each step rounded to it, then cast to e4m3 (never past ±448).

    Arguments:
        weight: e4m3 values (in e4m3 or any dtype that holds them exactly); scale: their float32 scale;
        max_scale: the group's largest scale; dtype: the model dtype.
    """
    if torch.equal(scale.reshape(()), max_scale.reshape(())):  # the same values: the bytes are carried over
        return weight.to(FP8_DTYPE)
    return weight.to(dtype).mul(scale.reshape(())).div(max_scale.reshape(())).to(FP8_DTYPE)


def fp8_fused(parts: list[torch.Tensor], scales: list[torch.Tensor], group_weight_scales: list[torch.Tensor],
              group_input_scales: list[torch.Tensor],
              dtype: torch.dtype) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """A fused q/k/v or gate/up linear as TensorRT-LLM runs it, with one weight and one input scale: the group's
    largest of each, and every part rescaled to that weight scale (``fp8_rescale``).

    Arguments:
        parts: e4m3 parts of the fused linear; scales: their float32 weight scales; group_weight_scales,
        group_input_scales: the scales of every linear of the group; dtype: the model dtype.
    """
    max_weight, max_input = torch.stack(group_weight_scales).max(), torch.stack(group_input_scales).max()
    rescaled = [fp8_rescale(part, scale, max_weight, dtype) for part, scale in zip(parts, scales, strict=True)]
    return rescaled, max_weight, max_input


def fp8_round_trip(x: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """Quantize ``x`` to e4m3 with ``scale`` (clamped) and back, in float32: activations and the KV cache.

    Arguments:
        x: any float tensor; scale: the dequantization scale.
    """
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).float() * scale
