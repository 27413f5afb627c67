"""NVFP4 weights (ModelOpt's unified format, ``quant_algo: NVFP4``, ``group_size: 16``).

A weight ``W [out, in]`` becomes e2m1 values packed two per byte (``[out, in/2]`` uint8, the even column in the low
nibble), one e4m3 ``weight_scale`` per block of 16 columns (``[out, in/16]``) and a float32 scalar
``weight_scale_2``: ``W ≈ e2m1 · weight_scale · weight_scale_2``.

* ``weight_scale_2 = amax|W| / (6 · 448)`` (fused q/k/v and gate/up share the largest amax);
* ``weight_scale = clamp(block_amax / (6 · weight_scale_2), 2⁻⁹, 448)`` cast to e4m3 (an all-zero block: 1);
* e2m1 = round-to-nearest-even of ``W / (weight_scale · weight_scale_2)`` on the grid 0, ½, 1, 1½, 2, 3, 4, 6
  (saturating at 6), the sign in bit 3 (a negative value that rounds to 0 keeps it);
* ``input_scale = amax|X| / (6 · 448)``, float32.

Every step is computed in the order and precision ModelOpt's export uses, so the bytes are the same.
"""

from __future__ import annotations

from concurrent.futures import Executor

import torch

E2M1_MAX = 6.0
E4M3_MAX = 448.0
GROUP_SIZE = 16
MIN_BLOCK_SCALE = 2.0 ** -9
MIN_ROWS_PER_WORKER = 64  # fewer rows per thread cost more in hand-off than they save
BLOCK_ELEMENTS = 1 << 18  # rows per pass of the quantizer: its float32 buffers stay in cache
E2M1_BOUNDS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])  # midpoints between grid values
E2M1_TIES_UP = torch.tensor([0.75, 1.75, 3.5])  # midpoints that round up to the even code
E2M1_VALUES = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float32)


def global_scale(amax: torch.Tensor | float) -> torch.Tensor:
    """``weight_scale_2`` or ``input_scale``: ``amax / (6 · 448)`` in float32, a scalar.

    Arguments:
        amax: the (group's) largest absolute value.
    """
    return (torch.as_tensor(amax, dtype=torch.float32) / (E2M1_MAX * E4M3_MAX)).reshape(())


def block_scales(weight: torch.Tensor, scale_2: torch.Tensor) -> torch.Tensor:
    """The e4m3 ``weight_scale`` of each block of 16 columns ([out, in/16]).

    Arguments:
        weight: [out, in] in the checkpoint dtype (in a multiple of 16); scale_2: its ``weight_scale_2``.
    """
    blocks = weight.reshape(weight.shape[0], -1, GROUP_SIZE)
    block_amax = torch.maximum(blocks.amax(-1).float(), blocks.amin(-1).float().neg_())
    scale = block_amax / (E2M1_MAX * scale_2)
    scale[scale == 0] = 1.0
    return scale.clamp_(MIN_BLOCK_SCALE, E4M3_MAX).to(torch.float8_e4m3fn)


def e2m1_codes(scaled: torch.Tensor) -> torch.Tensor:
    """The 4-bit e2m1 code of each value (uint8, 0..15), ties to even, saturating at ±6.

    Arguments:
        scaled: float32 values already divided by their scales.
    """
    codes = torch.empty(scaled.shape, dtype=torch.uint8)
    _codes_into(scaled, torch.empty_like(scaled), torch.empty(scaled.shape, dtype=torch.bool), codes)
    return codes


def _codes_into(scaled: torch.Tensor, magnitude: torch.Tensor, flag: torch.Tensor, codes: torch.Tensor) -> None:
    """``e2m1_codes`` into preallocated buffers: the code is the number of midpoints below |x|, plus one on the
    midpoints that round up to an even code (comparisons on uint8 run several times faster than a bucketize)."""
    torch.abs(scaled, out=magnitude)
    codes.zero_()
    for bound in E2M1_BOUNDS.tolist():
        torch.gt(magnitude, bound, out=flag)
        codes += flag.view(torch.uint8)
    for bound in E2M1_TIES_UP.tolist():
        torch.eq(magnitude, bound, out=flag)
        codes += flag.view(torch.uint8)
    torch.lt(scaled, 0, out=flag)
    codes |= flag.view(torch.uint8) << 3


def nvfp4_quantize(weight: torch.Tensor, scale_2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(packed [out, in/2] uint8, weight_scale [out, in/16] e4m3)`` of a weight, a cache-sized block of rows at a
    time through reused buffers.

    Arguments:
        weight: [out, in] in the checkpoint dtype; scale_2: its float32 scalar ``weight_scale_2``.
    """
    rows, cols = weight.shape
    if cols % GROUP_SIZE:
        raise ValueError(f"NVFP4 needs input features in multiples of {GROUP_SIZE}, got {cols}")
    scales = block_scales(weight, scale_2)
    divisor = (scales.float() * scale_2).unsqueeze(-1)
    packed = torch.empty((rows, cols // 2), dtype=torch.uint8)
    per_block = max(1, BLOCK_ELEMENTS // cols)
    scaled, magnitude = torch.empty((per_block, cols)), torch.empty((per_block, cols))
    flag, codes = torch.empty((per_block, cols), dtype=torch.bool), torch.empty((per_block, cols), dtype=torch.uint8)
    for start in range(0, rows, per_block):
        stop = min(rows, start + per_block)
        n = stop - start
        torch.div(weight[start:stop].reshape(n, -1, GROUP_SIZE), divisor[start:stop],
                  out=scaled[:n].view(n, -1, GROUP_SIZE))
        _codes_into(scaled[:n], magnitude[:n], flag[:n], codes[:n])
        torch.bitwise_or(codes[:n, 1::2] << 4, codes[:n, 0::2], out=packed[start:stop])
    return packed, scales


def nvfp4_quantize_rows(weight: torch.Tensor, scale_2: torch.Tensor, pool: Executor | None,
                        workers: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``nvfp4_quantize`` with the rows split into ``workers`` ranges run on ``pool`` (torch releases the GIL);
    rows are independent, so the bytes are the same.

    Arguments:
        weight: [out, in]; scale_2: its ``weight_scale_2``; pool: threads (None: the calling thread);
        workers: how many ranges.
    """
    count = min(workers, weight.shape[0] // MIN_ROWS_PER_WORKER) if pool is not None else 1
    if count <= 1:
        return nvfp4_quantize(weight, scale_2)
    assert pool is not None, "count > 1 needs a pool"
    parts = list(pool.map(lambda rows: nvfp4_quantize(rows, scale_2), weight.chunk(count)))
    return torch.cat([packed for packed, _ in parts]), torch.cat([scales for _, scales in parts])


def nvfp4_dequantize(packed: torch.Tensor, scales: torch.Tensor, scale_2: torch.Tensor) -> torch.Tensor:
    """The float32 weight an NVFP4 triple stands for: ``e2m1 · weight_scale · weight_scale_2``.

    Arguments:
        packed: [out, in/2] uint8; scales: [out, in/16] e4m3; scale_2: the float32 scalar.
    """
    codes = torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(packed.shape[0], -1)
    values = E2M1_VALUES[codes.long()].reshape(packed.shape[0], -1, GROUP_SIZE)
    return (values * (scales.float() * scale_2.float()).unsqueeze(-1)).reshape(packed.shape[0], -1)
