"""Scale formulas on hand-computed inputs, the SmoothQuant identity, FP8 clamping, and blocked == whole-tensor."""

from __future__ import annotations

import math

import pytest
import torch

from trtllm_kit.quant.blocks import BlockBuffer, col_amax, round_half_away_, row_amax, row_col_amax
from trtllm_kit.quant.fp8 import FP8_DTYPE, fp8_quantize, fp8_round_trip, fp8_scale
from trtllm_kit.quant.int8 import (
    quantize_per_token_int8,
    quantize_rows_int8,
    smoothed_row_amax,
    smoothing_scales,
    w8a16_dequantize,
    w8a16_quantize,
    w8a16_scale,
)
from trtllm_kit.quant.kv import fp8_kv_scale, int8_kv_scale, kv_round_trip

torch.set_num_threads(1)


def test_w8a16_scale_is_column_max_over_128_in_the_model_dtype() -> None:
    # W is [out, in]; a column of W^T is a row of W
    weight = torch.tensor([[1.0, -2.56, 0.5], [0.0, 0.0, 0.0], [64.0, 3.0, -1.0]], dtype=torch.bfloat16)
    scale = w8a16_scale(weight)
    assert scale.dtype == torch.bfloat16
    assert scale.tolist() == [torch.tensor(2.5625 / 128, dtype=torch.bfloat16).item(), 0.0, 0.5]


def test_w8a16_rounds_half_away_from_zero_and_clips_the_maximum_to_127() -> None:
    # scale = 128/128 = 1: values are their own quantized value before rounding
    weight = torch.tensor([[128.0, 2.5, -2.5, 0.5, -0.5, 1.5, -128.0, 3.49]], dtype=torch.float32)
    q, scale = w8a16_quantize(weight)
    assert scale.tolist() == [1.0]
    assert q.dtype == torch.int8
    assert q.tolist() == [[127, 3, -3, 1, -1, 2, -128, 3]]  # half away from zero; +128 clipped, -128 kept


def test_w8a16_all_zero_row_quantizes_to_zero_and_dequantizes() -> None:
    weight = torch.tensor([[0.0, 0.0], [1.0, -0.25]], dtype=torch.bfloat16)
    q, scale = w8a16_quantize(weight)
    assert q.tolist() == [[0, 0], [127, -32]]
    back = w8a16_dequantize(q, scale)
    assert back.dtype == torch.bfloat16
    assert back.float().tolist() == [[0.0, 0.0], [pytest.approx(127 / 128, abs=1e-2), -0.25]]


def test_round_half_away_from_zero() -> None:
    x = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49, -0.51])
    assert round_half_away_(x.clone(), torch.empty_like(x)).tolist() == [1, 2, 3, -1, -2, -3, 0, -1]


def test_smoothing_scales_formula() -> None:
    x = torch.tensor([4.0, 9.0, 0.0, 1.0])
    w = torch.tensor([1.0, 4.0, 2.0, 0.0])
    s = smoothing_scales(x, w, 0.5)
    # sqrt(x) / sqrt(w); x = 0 clamps the scale at 1e-5; w = 0 is clipped to 1e-5 before the power
    assert s.tolist() == pytest.approx([2.0, 1.5, 1e-5, 1.0 / math.sqrt(1e-5)], rel=1e-6)
    assert smoothing_scales(x, w, 1.0).tolist() == pytest.approx([4.0, 9.0, 1e-5, 1.0])
    assert smoothing_scales(x, w, 0.0)[:2].tolist() == pytest.approx([1.0, 0.25])


def test_smoothquant_identity_in_float32() -> None:
    """(X·diag(1/s))·(diag(s)·Wᵀ) = X·Wᵀ, and a norm folded with 1/s gives the smoothed input."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(5, 32, generator=generator) * torch.linspace(0.1, 20, 32)
    weight = torch.randn(16, 32, generator=generator)
    norm = 1 + 0.1 * torch.randn(32, generator=generator)
    s = smoothing_scales(x.abs().amax(0), weight.abs().amax(0), 0.5)
    reference = (x * norm) @ weight.T
    smoothed = (x * (norm / s)) @ (weight * s).T
    torch.testing.assert_close(smoothed, reference, rtol=1e-5, atol=1e-4)


def test_sq_int8_rows_per_tensor_and_per_channel() -> None:
    weight = torch.tensor([[1.0, -2.0], [0.5, 0.25]])
    smoother = torch.tensor([2.0, 1.0])
    buffer = BlockBuffer()
    amax = smoothed_row_amax(weight, smoother, buffer)
    assert amax.tolist() == [2.0, 1.0]  # rows of W·diag(s): [2, -2], [1, 0.25]
    per_channel = quantize_rows_int8(weight, 127.0 / amax, smoother, buffer)
    assert per_channel.tolist() == [[127, -127], [127, 32]]  # 31.75 → 32
    per_tensor = quantize_rows_int8(weight, torch.full((2,), 127.0 / 2.0), smoother, buffer)
    assert per_tensor.tolist() == [[127, -127], [64, 16]]  # 63.5 → 64 (half to even), 15.875 → 16


def test_per_token_activation_quantization() -> None:
    x = torch.tensor([[1.0, -0.5, 0.25], [0.0, 0.0, 0.0]])
    q, scale = quantize_per_token_int8(x)
    assert q.tolist() == [[127.0, -64.0, 32.0], [0.0, 0.0, 0.0]]  # -63.5 → -64 (half to even), 31.75 → 32
    assert scale[0].item() == pytest.approx(1 / 127)


def test_fp8_scale_and_quantization_of_known_values() -> None:
    assert fp8_scale(448.0) == 1.0
    assert fp8_scale(896.0) == 2.0
    weight = torch.tensor([[896.0, -896.0, 2.0, 1.0]])
    q = fp8_quantize(weight, fp8_scale(896.0))
    assert q.dtype == FP8_DTYPE
    assert q.float().tolist() == [[448.0, -448.0, 1.0, 0.5]]


@pytest.mark.parametrize("value", [448.0, 460.0, 479.0, 480.0, 1000.0, 1e30])
def test_fp8_clamps_before_the_cast_so_no_nan(value: float) -> None:
    q = fp8_quantize(torch.tensor([value, -value]), 1.0)
    assert q.float().tolist() == [448.0, -448.0]
    assert fp8_round_trip(torch.tensor([value]), 1.0).tolist() == [448.0]


def test_fp8_relative_error_within_e4m3() -> None:
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(64, 96, generator=generator).to(torch.bfloat16)
    scale = fp8_scale(float(weight.float().abs().max()))
    back = fp8_quantize(weight, scale).float() * scale
    normal = weight.float().abs() > scale * 2.0 ** -6  # e4m3 normals
    relative = ((back - weight.float()).abs() / weight.float().abs())[normal]
    assert float(relative.max()) <= 2.0 ** -4


@pytest.mark.parametrize("workers", [1, 3])  # 3 threads over 37 one-row blocks: uneven ranges
@pytest.mark.parametrize("elements", [7, 64, 1 << 18])
def test_blocked_kernels_equal_whole_tensor_math(elements: int, workers: int) -> None:
    generator = torch.Generator().manual_seed(2)
    weight = (torch.randn(37, 50, generator=generator) * 3).to(torch.bfloat16)
    buffer = BlockBuffer(elements, workers)
    scale = fp8_scale(float(weight.float().abs().max()))
    whole = (weight.float() / torch.tensor(scale)).clamp(-448, 448).to(FP8_DTYPE)
    assert torch.equal(fp8_quantize(weight, scale, buffer).view(torch.uint8), whole.view(torch.uint8))
    q, s = w8a16_quantize(weight, buffer)
    wt = weight.float() / s.float()[:, None]
    expected = (wt.sign() * (wt.abs() + 0.5).floor()).clamp(-128, 127).to(torch.int8)
    assert torch.equal(q, expected)
    row_scale = 127.0 / weight.float().abs().amax(1)
    assert torch.equal(quantize_rows_int8(weight, row_scale, None, buffer),
                       (weight.float() * row_scale[:, None]).round().clamp(-127, 127).to(torch.int8))


def test_kv_scales() -> None:
    assert int8_kv_scale(12.7) == pytest.approx(0.1)
    assert fp8_kv_scale(100.0, 300.0) == 1.0  # below 448: the recommended default 1.0
    assert fp8_kv_scale(896.0, 10.0) == 2.0
    k = torch.tensor([1.0, -0.05, 20.0])
    assert kv_round_trip(k, 0.1, "INT8").tolist() == pytest.approx([1.0, -0.0, 12.7])  # clipped at 127 steps
    assert kv_round_trip(k, 1.0, "FP8").tolist() == [1.0, -0.05078125, 20.0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_row_and_column_amax_equal_abs_amax_in_one_pass_or_two(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(3)
    weight = (torch.randn((700, 96), generator=generator) * 0.02).to(dtype)  # several row blocks of the scratch
    weight[5, 9], weight[600, 0] = -7.5, float("-inf")
    rows, cols = row_col_amax(weight)
    want_rows, want_cols = weight.float().abs().amax(1), weight.float().abs().amax(0)
    assert torch.equal(rows, want_rows) and torch.equal(cols, want_cols)
    assert torch.equal(row_amax(weight), want_rows) and torch.equal(col_amax(weight), want_cols)
    assert rows.dtype == cols.dtype == torch.float32
