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
from dataclasses import dataclass

import torch

from trtllm_kit.quant.blocks import magnitude_bits

E2M1_MAX = 6.0
E4M3_MAX = 448.0
GROUP_SIZE = 16
MIN_BLOCK_SCALE = 2.0 ** -9
MIN_ROWS_PER_WORKER = 64  # fewer rows per thread cost more in hand-off than they save
BLOCK_ELEMENTS = 1 << 18  # rows per pass of the quantizer: its float32 buffers stay in cache
E2M1_VALUES = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float32)


def global_scale(amax: torch.Tensor | float) -> torch.Tensor:
    """``weight_scale_2`` or ``input_scale``: ``amax / (6 · 448)`` in float32, a scalar.

    Arguments:
        amax: the (group's) largest absolute value.
    """
    return (torch.as_tensor(amax, dtype=torch.float32) / (E2M1_MAX * E4M3_MAX)).reshape(())


def block_amax(weight: torch.Tensor) -> torch.Tensor:
    """max |x| of each block of 16 columns ([out, in/16], float32). A 16-bit float's magnitude bits are halved
    four times with an elementwise max (a reduction over 16 elements is several times slower in torch).

    Arguments:
        weight: [out, in] (in a multiple of 16).
    """
    bits = magnitude_bits(weight)
    if bits is None:
        blocks = weight.reshape(weight.shape[0], -1, GROUP_SIZE)
        return torch.maximum(blocks.amax(-1).float(), blocks.amin(-1).float().neg_())
    width = GROUP_SIZE
    bits = bits.view(-1, width)
    while width > 1:
        width //= 2
        bits = torch.maximum(bits[:, :width], bits[:, width:])
    return bits.view(weight.dtype).float().view(weight.shape[0], -1)


def block_scales(weight: torch.Tensor, scale_2: torch.Tensor) -> torch.Tensor:
    """The e4m3 ``weight_scale`` of each block of 16 columns ([out, in/16]).

    Arguments:
        weight: [out, in] in the checkpoint dtype (in a multiple of 16); scale_2: its ``weight_scale_2``.
    """
    scale = block_amax(weight) / (E2M1_MAX * scale_2)
    scale[scale == 0] = 1.0
    return scale.clamp_(MIN_BLOCK_SCALE, E4M3_MAX).to(torch.float8_e4m3fn)


@dataclass
class _Scratch:
    """The quantizer's per-block buffers, made once per weight and reused for each block of rows."""

    magnitude: torch.Tensor  # float32: |x|, then the rounded |x|
    rounded: torch.Tensor  # float32
    ints: torch.Tensor  # int32
    sign: torch.Tensor  # bool
    half: torch.Tensor  # bool
    codes: torch.Tensor  # uint8

    @classmethod
    def of(cls, shape: tuple[int, ...]) -> _Scratch:
        return cls(torch.empty(shape), torch.empty(shape), torch.empty(shape, dtype=torch.int32),
                   torch.empty(shape, dtype=torch.bool), torch.empty(shape, dtype=torch.bool),
                   torch.empty(shape, dtype=torch.uint8))

    def rows(self, n: int) -> _Scratch:
        return _Scratch(*(t[:n] for t in vars(self).values()))


def e2m1_codes(scaled: torch.Tensor) -> torch.Tensor:
    """The 4-bit e2m1 code of each value (uint8, 0..15), ties to even, saturating at ±6 (NaN: 0).

    Arguments:
        scaled: float32 values already divided by their scales.
    """
    scratch = _Scratch.of(tuple(scaled.shape))
    _codes_into(scaled, scratch)
    return scratch.codes


def _codes_into(scaled: torch.Tensor, scratch: _Scratch) -> None:
    """``e2m1_codes`` into ``scratch.codes``. The magnitude is rounded half to even onto the grid by adding and
    subtracting 2²², 2²³ or 2²⁴ (whose float32 spacing is the grid's step of ½, 1 or 2 below 2, 4 and beyond), the
    power picked from the magnitude's exponent bits; the code of a rounded value from 1 up is its exponent and
    first mantissa bit (``bits >> 22`` less 252), and ½ is code 1."""
    s = scratch
    torch.lt(scaled, 0, out=s.sign)  # a negative value that rounds to 0 keeps its sign
    torch.abs(scaled, out=s.magnitude).nan_to_num_(nan=0.0, posinf=float("inf"))
    torch.bitwise_right_shift(s.magnitude.view(torch.int32), 23, out=s.ints)
    magic = s.ints.clamp_(127, 129).add_(22).bitwise_left_shift_(23).view(torch.float32)
    torch.add(s.magnitude, magic, out=s.rounded).sub_(magic).clamp_(max=E2M1_MAX)
    torch.eq(s.rounded, 0.5, out=s.half)
    torch.bitwise_right_shift(s.rounded.view(torch.int32), 22, out=s.ints).sub_(252).clamp_(min=0)
    s.codes.copy_(s.ints).add_(s.half.view(torch.uint8)).add_(s.sign.view(torch.uint8), alpha=8)


def _pack_into(codes: torch.Tensor, pairs: torch.Tensor, packed: torch.Tensor) -> None:
    """Two codes per byte, the even column in the low nibble: each pair of codes read as one little-endian
    int16 (even code in its low byte), OR-ed with itself shifted right by 4, whose low byte is the packed one."""
    both = codes.view(torch.int16)
    torch.bitwise_right_shift(both, 4, out=pairs).bitwise_or_(both)
    packed.copy_(pairs)  # int16 -> uint8 keeps the low byte


def nvfp4_quantize(weight: torch.Tensor, scale_2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(packed [out, in/2] uint8, weight_scale [out, in/16] e4m3)`` of a weight, a cache-sized block of rows at a
    time through reused buffers.

    Arguments:
        weight: [out, in] in the checkpoint dtype (in a multiple of 16); scale_2: its float32 scalar ``weight_scale_2``.
    """
    rows, cols = weight.shape
    if cols % GROUP_SIZE:
        raise ValueError(f"NVFP4 needs input features in multiples of {GROUP_SIZE}, got {cols}")
    scales = torch.empty((rows, cols // GROUP_SIZE), dtype=torch.float8_e4m3fn)
    packed = torch.empty((rows, cols // 2), dtype=torch.uint8)
    per_block = max(1, BLOCK_ELEMENTS // cols)
    scaled, scratch = torch.empty((per_block, cols)), _Scratch.of((per_block, cols))
    pairs = torch.empty((per_block, cols // 2), dtype=torch.int16)
    for start in range(0, rows, per_block):
        stop = min(rows, start + per_block)
        n = stop - start
        scales[start:stop] = block_scales(weight[start:stop], scale_2)  # the rows are in cache for the division
        divisor = (scales[start:stop].float() * scale_2).unsqueeze(-1)
        torch.div(weight[start:stop].reshape(n, -1, GROUP_SIZE), divisor, out=scaled[:n].view(n, -1, GROUP_SIZE))
        block = scratch.rows(n)
        _codes_into(scaled[:n], block)
        _pack_into(block.codes, pairs[:n], packed[start:stop])
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
