"""Blocked elementwise kernels: whole weights are processed a block of rows at a time through one reused float32
buffer, so a bf16 tensor never exists as a whole float32 copy (that is 4x slower and doubles peak memory)."""

from __future__ import annotations

from collections.abc import Callable

import torch

BLOCK_ELEMENTS = 1 << 18  # 1 MiB of float32: stays in cache between the copy-in, the math and the copy-out

RowMath = Callable[[torch.Tensor, slice], None]


class BlockBuffer:
    """One reusable float32 scratch buffer (and a second for kernels that need a temporary).

    Arguments:
        elements: the buffer size; a block holds as many whole rows as fit (at least one row).
    """

    def __init__(self, elements: int = BLOCK_ELEMENTS) -> None:
        self.elements = elements
        self._main = torch.empty(0)
        self._spare = torch.empty(0)

    def _grow(self, numel: int) -> None:
        if self._main.numel() < numel:
            self._main = torch.empty(numel)
            self._spare = torch.empty(numel)

    def map_rows(self, src: torch.Tensor, dst: torch.Tensor | None, math: RowMath) -> None:
        """For each block of rows of ``src`` (2-D, or 1-D as one row): copy into float32, run ``math(block,
        rows)`` in place, and copy the result into the same rows of ``dst`` (cast to its dtype) unless None.

        Arguments:
            src: the input tensor; dst: the output (same shape) or None; math: the in-place block function.
        """
        src2 = src.reshape(1, -1) if src.dim() == 1 else src
        dst2 = None if dst is None else (dst.reshape(1, -1) if dst.dim() == 1 else dst)
        rows, cols = src2.shape
        per_block = max(1, self.elements // max(cols, 1))
        self._grow(min(rows, per_block) * cols)
        for start in range(0, rows, per_block):
            stop = min(rows, start + per_block)
            block = self._main[: (stop - start) * cols].view(stop - start, cols)
            block.copy_(src2[start:stop])
            math(block, slice(start, stop))
            if dst2 is not None:
                dst2[start:stop].copy_(block)

    def spare(self, like: torch.Tensor) -> torch.Tensor:
        """A float32 temporary with the shape of the current block (valid inside ``math`` only)."""
        return self._spare[: like.numel()].view(like.shape)


def row_amax(tensor: torch.Tensor) -> torch.Tensor:
    """max |row| of a 2-D tensor (per output channel) in float32, without an absolute-value copy.

    Arguments:
        tensor: [rows, cols] in any float dtype.
    """
    return torch.maximum(tensor.amax(-1).float(), tensor.amin(-1).float().neg_())  # aminmax(dim) is 5x slower


def col_amax(tensor: torch.Tensor) -> torch.Tensor:
    """max |column| of a 2-D tensor (per input channel) in float32.

    Arguments:
        tensor: [rows, cols] in any float dtype.
    """
    return torch.maximum(tensor.amax(0).float(), tensor.amin(0).float().neg_())


def tensor_amax(tensor: torch.Tensor) -> float:
    """max |x| over a whole tensor, as a Python float.

    Arguments:
        tensor: any float tensor.
    """
    if tensor.numel() == 0:
        return 0.0
    low, high = torch.aminmax(tensor)
    return max(-float(low), float(high))


def round_half_away_(block: torch.Tensor, spare: torch.Tensor) -> torch.Tensor:
    """Round in place to the nearest integer, halves away from zero (C ``round()``).

    Arguments:
        block: float32 values; spare: a float32 temporary of the same shape.
    """
    torch.copysign(torch.full((), 0.5), block, out=spare)
    return block.add_(spare).trunc_()
