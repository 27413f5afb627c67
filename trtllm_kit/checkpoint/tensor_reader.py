"""HF tensors read one at a time from memory-mapped files (safetensors, or pickle when allowed), where a written
tensor's bytes are in those files, and the refusal of NaN/Inf weights and float16 overflow."""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any, NamedTuple

import torch
from safetensors import safe_open

from trtllm_kit.errors import CheckpointError
from trtllm_kit.interrupts import INTERRUPTS
from trtllm_kit.models.inspect import ModelSpec, TensorInfo
from trtllm_kit.safetensors_io import FileSlice


class SourceRead(NamedTuple):
    """One source as read: the HF name, the tensor read (a slice's rows only), it in the checkpoint dtype, and
    the row range of a slice (None for a whole tensor)."""

    name: str
    original: torch.Tensor
    converted: torch.Tensor
    rows: tuple[int, int] | None = None


class TensorReader:
    """Reads HF tensors one at a time from memory-mapped files (safetensors, or pickle when allowed)."""

    def __init__(self, model: ModelSpec, stack: ExitStack) -> None:
        self._tensors = model.tensors
        self._handles: dict[Path, Any] = {}
        self._fds: dict[Path, int] = {}
        self._stack = stack
        self._pickle = model.weight_format == "pickle"

    def locator(self, sources: list[SourceRead]) -> Callable[[torch.Tensor], FileSlice | None]:
        """A function that tells which input file bytes a tensor to be written is equal to: a contiguous view
        of a source read unchanged (same dtype) is a byte range of its safetensors file (a slice's rows are
        one contiguous range too).

        Arguments:
            sources: the sources of one work item as read, alive while it is written.
        """
        spans = []
        for name, original, converted, rows in sources:
            info: TensorInfo = self._tensors[name]
            if converted is original and info.offset is not None and not original.is_meta:
                fd = self._fds.get(info.path)
                if fd is None:
                    fd = self._fds[info.path] = os.open(info.path, os.O_RDONLY)
                    self._stack.callback(os.close, fd)
                start = rows[0] * (info.nbytes // info.shape[0]) if rows else 0
                spans.append((original.data_ptr(), original.numel() * original.element_size(), fd,
                              info.offset + start))

        def locate(part: torch.Tensor) -> FileSlice | None:
            if not part.is_contiguous():
                return None
            start, nbytes = part.data_ptr(), part.numel() * part.element_size()
            for pointer, size, fd, offset in spans:
                if pointer <= start and start + nbytes <= pointer + size:
                    return FileSlice(fd, offset + start - pointer, nbytes)
            return None

        return locate

    def read(self, name: str, rows: tuple[int, int] | None = None) -> torch.Tensor:
        """One HF tensor, or only its rows ``[start, stop)``.

        Arguments:
            name: the HF tensor name; rows: a row range of it, or None for the whole tensor.
        """
        info: TensorInfo = self._tensors[name]
        handle = self._handles.get(info.path)
        if handle is None:
            if self._pickle:
                handle = torch.load(info.path, map_location="cpu", mmap=True, weights_only=True)
            else:
                with INTERRUPTS.deferred():
                    handle = self._stack.enter_context(safe_open(str(info.path), framework="pt"))
            self._handles[info.path] = handle
        try:
            with INTERRUPTS.deferred():
                if rows is None:
                    return handle[name] if self._pickle else handle.get_tensor(name)
                return handle[name][rows[0]:rows[1]] if self._pickle else handle.get_slice(name)[rows[0]:rows[1]]
        except Exception as exc:  # a file that changed or broke after inspection
            raise CheckpointError(f"{info.path.name}: reading {name} failed ({exc}).") from None


def check_finite(name: str, original: torch.Tensor, converted: torch.Tensor, dtype: str) -> None:
    """Refuse NaN/Inf weights and float16 overflow.

    A sum is NaN/Inf whenever any element is, and costs a quarter of ``isfinite``; only a non-finite sum
    (a bad element, or a sum that overflowed by itself) takes the exact path.
    """
    if converted.is_meta or converted.numel() == 0 or bool(torch.isfinite(converted.sum())):
        return
    bad = ~torch.isfinite(original)
    if bool(bad.any()):
        nan, inf = int(torch.isnan(original).sum()), int(torch.isinf(original).sum())
        first = tuple(int(i) for i in bad.nonzero()[0])
        raise CheckpointError(f"HF tensor {name} holds {nan} NaN and {inf} infinite value(s), the first at index "
                              f"{first}; the weights are corrupt, so the kit refuses to build from them.")
    if not bool(torch.isfinite(converted).all()):
        raise CheckpointError(f"HF tensor {name} overflows {dtype} (max |w| = {original.abs().max().item():.4g}); "
                              "convert with --dtype bfloat16 or float32.")
