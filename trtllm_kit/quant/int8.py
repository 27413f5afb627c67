"""INT8 math: the W8A16 CPU preview and SmoothQuant (TensorRT-LLM plugin flavour).

W8A16 (``docs/trtllm-checkpoint.md`` §5.2): scale = column max of Wᵀ / 128 in the model dtype,
q = clip(round-half-away(Wᵀ / s), -128, 127).
The checkpoint keeps model-dtype weights (the build quantizes them on the GPU); the preview is what the CPU
runtime and ``verify`` compute with.

SmoothQuant (§5.3): s_j = clamp(x_j^α / w_j^(1−α), 1e-5) per input channel; the preceding norm is divided by s
and the weight columns multiplied by it (o_proj/down_proj write s as ``smoother``); weights are int8 with
per-tensor (per q/k/v part for qkv) or per-channel scales 127/amax, rounded half to even, clipped to ±127.
"""

from __future__ import annotations

import torch

from trtllm_kit.quant.blocks import BlockBuffer, col_amax, round_half_away_, row_amax

INT8_MAX = 127.0
W8A16_DIVISOR = 128.0  # 1 << (bits - 1): symmetric_quantize divides by 128, not 127
SMOOTH_MIN = 1e-5


def w8a16_scale(weight: torch.Tensor) -> torch.Tensor:
    """Per output channel scale ``max |W[c, :]| / 128`` in the weight's dtype.

    Arguments:
        weight: [out, in] in the model dtype.
    """
    return (row_amax(weight) / W8A16_DIVISOR).to(weight.dtype)


def w8a16_quantize(weight: torch.Tensor, buffer: BlockBuffer | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The W8A16 preview: int8 [out, in] and the per-output-channel scale (model dtype); q = 0 where s = 0.

    One pass: each block of rows yields its own scales (a row is one output channel) before it is quantized.

    Arguments:
        weight: [out, in] in the model dtype; buffer: a reused block buffer.
    """
    buffer = buffer or BlockBuffer()
    scale = torch.empty(weight.shape[0], dtype=weight.dtype)
    q = torch.empty(weight.shape, dtype=torch.int8)

    def math(block: torch.Tensor, rows: slice) -> None:
        s = (row_amax(block) / W8A16_DIVISOR).to(weight.dtype)
        scale[rows] = s
        block.div_(torch.where(s == 0, torch.ones_like(s), s).float()[:, None])
        round_half_away_(block, buffer.spare(block)).clamp_(-128, 127)

    buffer.map_rows(weight, q, math)
    return q, scale


def w8a16_dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``q * s`` in the scale's dtype (what the weight-only GEMM multiplies with).

    Arguments:
        q: int8 [out, in]; scale: [out] in the model dtype.
    """
    return q.to(scale.dtype) * scale[:, None]


def w8a16_round_trip(weight: torch.Tensor) -> torch.Tensor:
    """Quantize and dequantize a weight with the preview math.

    Arguments:
        weight: [out, in] in the model dtype.
    """
    return w8a16_dequantize(*w8a16_quantize(weight))


def smoothing_scales(x_amax: torch.Tensor, w_col_amax: torch.Tensor, alpha: float) -> torch.Tensor:
    """``s_j = clamp(x_j^α / w_j^(1−α), 1e-5)`` in float32, with ``w_j`` (max over rows) clipped at 1e-5.

    Arguments:
        x_amax: [in] max |activation| per input channel; w_col_amax: [in] max |W[:, j]| over the fused rows;
        alpha: the migration strength.
    """
    w = w_col_amax.float().clamp(min=SMOOTH_MIN)
    return (x_amax.float().pow(alpha) / w.pow(1.0 - alpha)).clamp(min=SMOOTH_MIN)


def smoothed_row_amax(weight: torch.Tensor, smoother: torch.Tensor, buffer: BlockBuffer) -> torch.Tensor:
    """max |W[c, :] * s| per output row in float32, computed block by block.

    Arguments:
        weight: [out, in]; smoother: [in] float32; buffer: a reused block buffer.
    """
    amax = torch.empty(weight.shape[0])

    def math(block: torch.Tensor, rows: slice) -> None:
        block.mul_(smoother)
        amax[rows] = row_amax(block)

    buffer.map_rows(weight, None, math)
    return amax


def quantize_rows_int8(weight: torch.Tensor, row_scale: torch.Tensor, smoother: torch.Tensor | None,
                       buffer: BlockBuffer) -> torch.Tensor:
    """``clip(round(W * s * row_scale[:, None]), -127, 127)`` as int8, rounding half to even (numpy's round).

    Arguments:
        weight: [out, in]; row_scale: [out] float32 (127 / amax); smoother: [in] float32 or None;
        buffer: a reused block buffer.
    """
    q = torch.empty(weight.shape, dtype=torch.int8)

    def math(block: torch.Tensor, rows: slice) -> None:
        if smoother is not None:
            block.mul_(smoother)
        block.mul_(row_scale[rows, None]).round_().clamp_(-INT8_MAX, INT8_MAX)

    buffer.map_rows(weight, q, math)
    return q


def weight_column_amax(weights: list[torch.Tensor]) -> torch.Tensor:
    """max |W[:, j]| over the rows of several weights with the same input (q/k/v, gate/up).

    Arguments:
        weights: [out_i, in] tensors.
    """
    return torch.stack([col_amax(w) for w in weights]).amax(0)


def quantize_activation_int8(x: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """``clip(round(x * scale), -128, 127)`` as float values: the plugin's static quantization of activations.

    Arguments:
        x: activations (any float dtype); scale: the orig→quant factor (``scale_to_int``).
    """
    return (x.float() * scale).round().clamp(-128, 127)


def quantize_per_token_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token quantization: int8 values (as float) and the per-token quant→orig scale amax/127.

    Arguments:
        x: activations [..., in].
    """
    xf = x.float()
    scale = xf.abs().amax(-1, keepdim=True).clamp(min=1e-12) / INT8_MAX
    return (xf / scale).round().clamp(-128, 127), scale
