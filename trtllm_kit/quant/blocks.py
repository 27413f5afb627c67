"""Blocked elementwise kernels: whole weights are processed a block of rows at a time through one reused float32
buffer, so a bf16 tensor never exists as a whole float32 copy (that is 4x slower and doubles peak memory)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import torch

BLOCK_ELEMENTS = 1 << 18  # 1 MiB of float32: stays in cache between the copy-in, the math and the copy-out

RowMath = Callable[[torch.Tensor, slice], None]


def default_workers() -> int:
    """Threads for the blocked kernels: the CPUs this process may use, at most 4 (beyond that the kernels are
    memory-bound)."""
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(4, available))


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run the block with ``count`` intra-op threads (the process's setting is restored after).

    Arguments:
        count: threads per torch op; 1 when the blocks run on threads of their own.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class BlockBuffer:
    """Reusable float32 scratch buffers (a second for kernels that need a temporary), one pair per thread.

    Large tensors are split into contiguous ranges of row blocks, one per worker thread; each thread runs the
    torch ops of its blocks with the GIL released, so the kernels use several cores even with one intra-op
    thread.

    Arguments:
        elements: the block size; a block holds as many whole rows as fit (at least one row).
        workers: threads (``default_workers()`` when None; 1 runs everything on the calling thread).
    """

    def __init__(self, elements: int = BLOCK_ELEMENTS, workers: int | None = None) -> None:
        self.elements = elements
        self.workers = workers or default_workers()
        self._local = threading.local()
        self._pool: ThreadPoolExecutor | None = None

    def _scratch(self, numel: int) -> torch.Tensor:
        local = self._local
        if getattr(local, "main", None) is None or local.main.numel() < numel:
            local.main, local.spare = torch.empty(numel), torch.empty(numel)
        return local.main

    def map_rows(self, src: torch.Tensor, dst: torch.Tensor | None, math: RowMath) -> None:
        """For each block of rows of ``src`` (2-D, or 1-D as one row): copy into float32, run ``math(block,
        rows)`` in place, and copy the result into the same rows of ``dst`` (cast to its dtype) unless None.
        ``math`` may run on several threads at once, each on its own rows.

        Arguments:
            src: the input tensor; dst: the output (same shape) or None; math: the in-place block function.
        """
        src2 = src.reshape(1, -1) if src.dim() == 1 else src
        dst2 = None if dst is None else (dst.reshape(1, -1) if dst.dim() == 1 else dst)
        rows, cols = src2.shape
        per_block = max(1, self.elements // max(cols, 1))
        starts = list(range(0, rows, per_block))
        workers = min(self.workers, len(starts) // 4)  # a few blocks each, or the threads cost more than they save
        if workers <= 1:
            self._map_blocks(src2, dst2, math, starts, per_block)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="quant-block")
        size = -(-len(starts) // workers)
        ranges = [starts[i:i + size] for i in range(0, len(starts), size)]
        for done in [self._pool.submit(self._map_blocks, src2, dst2, math, r, per_block) for r in ranges]:
            done.result()

    def _map_blocks(self, src2: torch.Tensor, dst2: torch.Tensor | None, math: RowMath, starts: list[int],
                    per_block: int) -> None:
        rows, cols = src2.shape
        main = self._scratch(min(rows, per_block) * cols)
        for start in starts:
            stop = min(rows, start + per_block)
            block = main[: (stop - start) * cols].view(stop - start, cols)
            block.copy_(src2[start:stop])
            math(block, slice(start, stop))
            if dst2 is not None:
                dst2[start:stop].copy_(block)

    def spare(self, like: torch.Tensor) -> torch.Tensor:
        """A float32 temporary with the shape of the current block (valid inside ``math`` only, on its thread)."""
        return self._local.spare[: like.numel()].view(like.shape)


MAGNITUDE_BITS = {torch.bfloat16: (torch.int16, 0x7FFF), torch.float16: (torch.int16, 0x7FFF)}  # (float32: slower)


def magnitude_bits(tensor: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor | None:
    """``|tensor|`` as integers: each float's bit pattern with the sign bit cleared (non-negative floats order
    as their bits do, NaN above everything), so a max over them is one integer pass where ``amax`` and ``amin``
    of a bfloat16 tensor are two slow ones; None for another dtype (its ``amax`` and ``amin`` are fast).

    Arguments:
        tensor: any float tensor; out: an integer scratch of its shape and element size (made when None).
    """
    if tensor.dtype not in MAGNITUDE_BITS:
        return None
    integer, mask = MAGNITUDE_BITS[tensor.dtype]
    return torch.bitwise_and(tensor.view(integer), mask, out=out)


def _bits_amax(tensor: torch.Tensor, dims: tuple[int, ...]) -> list[torch.Tensor] | None:
    """max |x| of a 2-D 16-bit float tensor along each of ``dims`` in float32, from its magnitude bits a block of
    rows at a time (one block-sized integer scratch, no weight-sized copy, one pass for every dim); None for
    another dtype."""
    if tensor.dtype not in MAGNITUDE_BITS or tensor.dim() != 2 or tensor.numel() == 0:
        return None
    rows, cols = tensor.shape
    per_block = max(1, BLOCK_ELEMENTS // max(1, cols))
    scratch = torch.empty((min(rows, per_block), cols), dtype=MAGNITUDE_BITS[tensor.dtype][0], device=tensor.device)
    parts: dict[int, list[torch.Tensor]] = {dim: [] for dim in dims}
    with torch_threads(1):  # small ops: a second thread would cost a barrier each, a long one on a busy machine
        for start in range(0, rows, per_block):
            bits = magnitude_bits(tensor[start:start + per_block], scratch[: min(rows - start, per_block)])
            assert bits is not None, "a dtype of MAGNITUDE_BITS"
            for dim in dims:
                parts[dim].append(bits.amax(dim))
        amax = [torch.cat(parts[dim]) if dim == 1 else torch.stack(parts[dim]).amax(0) for dim in dims]
    return [a.view(tensor.dtype).float() for a in amax]


def row_amax(tensor: torch.Tensor) -> torch.Tensor:
    """max |row| of a 2-D tensor (per output channel) in float32, without an absolute-value copy.

    Arguments:
        tensor: [rows, cols] in any float dtype.
    """
    amax = _bits_amax(tensor, (1,))
    if amax is not None:
        return amax[0]
    return torch.maximum(tensor.amax(-1).float(), tensor.amin(-1).float().neg_())  # aminmax(dim) is 5x slower


def col_amax(tensor: torch.Tensor) -> torch.Tensor:
    """max |column| of a 2-D tensor (per input channel) in float32.

    Arguments:
        tensor: [rows, cols] in any float dtype.
    """
    amax = _bits_amax(tensor, (0,))
    if amax is not None:
        return amax[0]
    return torch.maximum(tensor.amax(0).float(), tensor.amin(0).float().neg_())


def row_col_amax(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(row_amax, col_amax)`` of a 2-D tensor, in one pass over it where its dtype allows.

    Arguments:
        tensor: [rows, cols] in any float dtype.
    """
    amax = _bits_amax(tensor, (1, 0))
    if amax is not None:
        return amax[0], amax[1]
    return row_amax(tensor), col_amax(tensor)


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
