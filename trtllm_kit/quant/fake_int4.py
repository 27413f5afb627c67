"""The int4 code range and the AWQ search's fake quantization (``quant/awq.py``): ``weight · scale`` rounded to
the weight's dtype, then per group of 128 input features ``round(v · 7/amax)`` clamped to [-8, 7] and divided by
``7/amax``, in float32, the result rounded to the weight's dtype: ModelOpt's arithmetic, so the searched scales
are the same.

The search fake-quantizes every linear's weight once per alpha (11 times), so this is the search's hot loop. It
runs a block of rows at a time: the block's scaled copy, its float32 work copy and its group amax stay in cache
and no whole-weight float32 copy is made (allocating one costs more than its arithmetic). A group's amax is the
largest of its magnitudes' bit patterns (``blocks.magnitude_bits``). The row blocks are split over
worker threads, each running its ops on one intra-op thread: no barrier per op, so a core taken by another
process delays only its own rows.
"""

from __future__ import annotations

from concurrent.futures import Executor

import torch

from trtllm_kit.layout import AWQ_GROUP_SIZE
from trtllm_kit.quant.blocks import MAGNITUDE_BITS, magnitude_bits

INT4_MAX = 7.0
INT4_MIN = -8.0
ZERO_AMAX = 1.0 / (1 << 24)  # a group whose amax is at most this quantizes to zeros in the search
BLOCK_ELEMENTS = 1 << 18  # weight elements per block: 1 MiB of float32 work


def group_amax(groups: torch.Tensor, bits: torch.Tensor | None = None) -> torch.Tensor:
    """max |v| of each row of ``groups``, in their dtype (``[n, 1]``).

    Arguments:
        groups: ``[n, 128]`` floats, contiguous; bits: an integer scratch of the same shape and element size
        (made when None; unused for float32).
    """
    bits = magnitude_bits(groups, bits)
    if bits is None:
        return torch.maximum(groups.amax(1, keepdim=True).abs_(), groups.amin(1, keepdim=True).abs_())
    return bits.amax(1, keepdim=True).view(groups.dtype)


class FakeInt4:
    """The search's fake-quantized ``weight · scale``, for one weight and many scales.

    Arguments:
        weight: ``[out, in]`` in the compute dtype, ``in`` a multiple of ``group_size``; pool: worker threads for the
        row blocks (None: the calling thread); workers: how many ranges of blocks to split the rows into;
        group_size: input features per group.
    """

    def __init__(self, weight: torch.Tensor, pool: Executor | None = None, workers: int = 1,
                 group_size: int = AWQ_GROUP_SIZE) -> None:
        self.weight = weight.detach()  # the pool's threads do not share the caller's no_grad
        self.group_size = group_size
        self.pool = pool
        rows, cols = weight.shape
        self.rows_per_block = max(1, min(rows, BLOCK_ELEMENTS // cols))
        starts = list(range(0, rows, self.rows_per_block))
        count = max(1, min(workers, len(starts))) if pool is not None else 1
        size = -(-len(starts) // count)
        self.ranges = [starts[i:i + size] for i in range(0, len(starts), size)]
        self.result = torch.empty_like(weight)

    def __call__(self, scale: torch.Tensor) -> torch.Tensor:
        """The fake-quantized ``weight · scale``, in a buffer the next call overwrites. The pool's threads must
        run with one intra-op thread (``blocks.torch_threads(1)``) for the blocks to run side by side.

        Arguments:
            scale: float32 ``[in]``.
        """
        factor = scale.to(self.weight.dtype)
        if self.pool is None or len(self.ranges) == 1:
            for starts in self.ranges:
                self._run(factor, starts)
            return self.result
        for done in [self.pool.submit(self._run, factor, starts) for starts in self.ranges]:
            done.result()
        return self.result

    def _run(self, factor: torch.Tensor, starts: list[int]) -> None:
        rows, cols = self.weight.shape
        num_groups = self.rows_per_block * cols // self.group_size
        scaled = torch.empty((num_groups, self.group_size), dtype=self.weight.dtype, device=self.weight.device)
        integer = MAGNITUDE_BITS.get(scaled.dtype, (None,))[0]
        bits = None if integer is None else torch.empty_like(scaled, dtype=integer)
        work = torch.empty_like(scaled, dtype=torch.float32)
        seven = torch.tensor(INT4_MAX)
        for start in starts:
            stop = min(rows, start + self.rows_per_block)
            count = (stop - start) * cols // self.group_size
            groups = scaled[:count]
            torch.mul(self.weight[start:stop], factor, out=groups.view(stop - start, cols))
            amax = group_amax(groups, None if bits is None else bits[:count]).float()
            inverse = seven / amax
            empty = amax <= ZERO_AMAX
            has_empty = bool(empty.any())
            if has_empty:
                inverse[empty] = 0.0
            codes = work[:count].copy_(groups).mul_(inverse).round_().clamp_(INT4_MIN, INT4_MAX)
            if has_empty:
                inverse[empty] = 1.0
            self.result[start:stop].view(-1, self.group_size).copy_(codes.div_(inverse))
