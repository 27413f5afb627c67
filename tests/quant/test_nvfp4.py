"""NVFP4's math on its own (the byte-for-byte comparison with ModelOpt is tests/llmapi/test_nvfp4_modelopt.py):
rounding to the e2m1 grid, the nibble order, block scales and the dequantization."""

from __future__ import annotations

from itertools import pairwise

import pytest
import torch

from trtllm_kit.quant.nvfp4 import (
    E2M1_VALUES,
    block_amax,
    block_scales,
    e2m1_codes,
    global_scale,
    nvfp4_dequantize,
    nvfp4_quantize,
)

GRID = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def nearest_even(value: float) -> float:
    """The grid value nearest ``value`` (saturating at 6); on a tie the one with the even code."""
    magnitude = min(abs(value), 6.0)
    best = min(range(8), key=lambda i: (abs(GRID[i] - magnitude), i % 2))
    return GRID[best] if value >= 0 else -GRID[best]


def test_codes_round_to_the_nearest_grid_value_ties_to_even() -> None:
    midpoints = [(a + b) / 2 for a, b in pairwise(GRID)]
    values = torch.tensor([*GRID, *midpoints, 7.5, 100.0, 0.1, 2.2, 4.9, 5.1]
                          + [-v for v in (*midpoints, 0.3, 6.5)])
    decoded = E2M1_VALUES[e2m1_codes(values).long()]
    assert decoded.tolist() == [nearest_even(v) for v in values.tolist()]
    assert e2m1_codes(torch.tensor([-0.1])).item() == 8  # a negative value that rounds to 0 keeps its sign bit


def test_codes_one_step_either_side_of_every_midpoint_and_beyond_the_grid() -> None:
    midpoints = torch.tensor([(a + b) / 2 for a, b in pairwise(GRID)])
    near = torch.cat([torch.nextafter(midpoints, torch.tensor(0.0)), torch.nextafter(midpoints, torch.tensor(9.0)),
                      torch.tensor([1e-30, 2.0 ** -126, 5.999, 6.0001, 3.4e38, 1.9999, 3.9999])])
    values = torch.cat([near, -near])
    decoded = E2M1_VALUES[e2m1_codes(values).long()]
    assert decoded.tolist() == [nearest_even(v) for v in values.tolist()]
    assert e2m1_codes(torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0])).tolist() == [0, 7, 15, 0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_block_amax_is_the_max_magnitude_of_each_16_columns(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(4)
    weight = (torch.randn(24, 96, generator=generator) * 0.1).to(dtype)
    weight[2, 17], weight[5, :16] = -9.0, 0.0
    want = weight.float().abs().reshape(24, 6, 16).amax(-1)
    assert torch.equal(block_amax(weight), want)


def test_packing_puts_the_even_column_in_the_low_nibble() -> None:
    weight = torch.tensor([[6.0, -0.5] + [0.0] * 14])
    packed, scales = nvfp4_quantize(weight, global_scale(6.0 * 448))  # block scale 1: values are their own codes
    assert scales.float().tolist() == [[1.0]]
    assert packed[0, 0].item() == 0x9 << 4 | 0x7  # -0.5 high, 6 low


def test_an_all_zero_block_gets_scale_one_and_round_trips() -> None:
    generator = torch.Generator().manual_seed(0)
    weight = (torch.randn(8, 64, generator=generator) * 0.05).to(torch.bfloat16)
    weight[3, 16:32] = 0
    scale_2 = global_scale(weight.abs().max().float())
    assert block_scales(weight, scale_2).float()[3, 1].item() == 1.0
    packed, scales = nvfp4_quantize(weight, scale_2)
    restored = nvfp4_dequantize(packed, scales, scale_2)
    assert torch.equal(restored[3, 16:32], torch.zeros(16))
    block_amax = weight.float().abs().reshape(8, 4, 16).amax(-1, keepdim=True)
    error = (restored.reshape(8, 4, 16) - weight.float().reshape(8, 4, 16)).abs()
    assert bool((error <= block_amax / 6 * 1.07).all())  # half a grid step of 2 at the top, e4m3 scale rounding
