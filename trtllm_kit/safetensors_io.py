"""Streaming safetensors: read headers without loading data, write a file tensor by tensor.

``safetensors.torch.save_file`` needs every tensor of a file in memory at once; a rank file of a 70B model
does not fit. The writer here lays out the header first (names, dtypes, shapes are known before any data)
and then writes each tensor at its offset as the converter produces it, so memory follows the largest
tensor, not the file. A part that is a byte range of an input file (a ``FileSlice``) is copied by the kernel
(``copy_file_range``) without passing through this process's memory.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from trtllm_kit.errors import CheckpointError

DTYPE_CODES: dict[torch.dtype, str] = {
    torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int8: "I8",
    torch.uint8: "U8", torch.int32: "I32", torch.int64: "I64", torch.float8_e4m3fn: "F8_E4M3",
    torch.bool: "BOOL", torch.float64: "F64",
}
DTYPES_BY_CODE = {code: dtype for dtype, code in DTYPE_CODES.items()}

# The largest header the kit parses. A real shard's header holds a few thousand entries of about 120 bytes
# (a 671B MoE checkpoint: under 1,000 per file); 16 MiB holds over 100,000 of them. Past it, parsing the JSON
# into Python objects would take seconds and hundreds of MB before any entry could be checked.
MAX_HEADER_BYTES = 16 * 1024 * 1024


def read_header(path: Path) -> dict[str, dict]:
    """The tensor entries of a safetensors file (name → dtype, shape, data_offsets), checked against its size.

    Arguments:
        path: the file.
    """
    return read_layout(path)[0]


def read_layout(path: Path) -> tuple[dict[str, dict], int]:
    """The tensor entries of a safetensors file and the file offset where its data begins (``data_offsets``
    count from there), checked against the file's size.

    Arguments:
        path: the file.
    """
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path} is truncated ({size} bytes): not a safetensors file.")
        (length,) = struct.unpack("<Q", head)
        if length > size - 8:
            raise CheckpointError(f"{path} is truncated or not a safetensors file (header of {length} bytes "
                                  f"in a file of {size}).")
        if length > MAX_HEADER_BYTES:
            raise CheckpointError(f"{path} has a safetensors header of {length:,} bytes, over the kit's bound of "
                                  f"{MAX_HEADER_BYTES:,} (real shards hold a few thousand entries); it is not read. "
                                  "Re-save the checkpoint in smaller shards.")
        try:
            header = json.loads(f.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            raise CheckpointError(f"{path} has a corrupt safetensors header: it is not JSON.") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path} has a corrupt safetensors header: a JSON {type(header).__name__}, not an "
                              "object of tensors.")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CheckpointError(f"{path} has a corrupt safetensors header: __metadata__ must map names to strings.")
    _check_entries(path, header, size - 8 - length)
    return header, 8 + length


# Every dtype code of the safetensors format, with its size in bytes (the kit reads those in DTYPE_CODES).
ITEM_SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
              "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


def _check_entries(path: Path, header: dict, data_size: int) -> None:
    """Refuse entries whose dtype, shape or data offsets no safetensors reader could follow, with a sentence
    naming the tensor; the data ranges must lie inside the file and not overlap."""
    spans = []
    for name, entry in header.items():
        where = f"{path} has a corrupt safetensors header: tensor {name!r}"
        if not isinstance(entry, dict):
            raise CheckpointError(f"{where} is described by {entry!r:.40}, not an object.")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in ITEM_SIZES:
            raise CheckpointError(f"{where} has dtype {dtype!r:.40}, which is not a safetensors dtype "
                                  f"({', '.join(ITEM_SIZES)}).")
        if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
            raise CheckpointError(f"{where} has shape {shape!r:.40}; a shape is a list of non-negative integers.")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)
                and offsets[0] <= offsets[1]):
            raise CheckpointError(f"{where} has data_offsets {offsets!r:.40}; they are [begin, end] with "
                                  "0 <= begin <= end.")
        spans.append((offsets[0], offsets[1], name))
    end = max((span[1] for span in spans), default=0)
    if end > data_size:
        raise CheckpointError(f"{path} is truncated: its header describes {end} bytes of data but the file "
                              f"holds {data_size}; download or copy it again.")
    for begin, stop, name in spans:
        entry = header[name]
        nbytes = ITEM_SIZES[entry["dtype"]]
        for dim in entry["shape"]:
            nbytes *= dim
        if stop - begin != nbytes:
            raise CheckpointError(f"{path} has a corrupt safetensors header: tensor {name!r} spans {stop - begin} "
                                  f"bytes but its {entry['dtype']} shape {entry['shape']} needs {nbytes}.")
    spans.sort()
    for (_, end, first), (begin, _, second) in itertools.pairwise(spans):
        if begin < end:
            raise CheckpointError(f"{path} has a corrupt safetensors header: the data of tensors {first!r} and "
                                  f"{second!r} overlap.")


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True)
class FileSlice:
    """``nbytes`` bytes of an open file at ``offset``."""

    fd: int
    offset: int
    nbytes: int


# Errors that mean "this kernel or file system cannot copy_file_range here": fall back to writing from memory.
_NO_KERNEL_COPY = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EPERM}
_kernel_copy = hasattr(os, "copy_file_range")


def copy_slice(source: FileSlice, fd: int, offset: int) -> bool:
    """Copy ``source`` to ``fd`` at ``offset`` in the kernel; False (nothing written) where that is not possible.

    Arguments:
        source: the bytes to copy.
        fd: the destination file.
        offset: where they go in it.
    """
    global _kernel_copy
    done = 0
    while _kernel_copy and done < source.nbytes:
        try:
            copied = os.copy_file_range(source.fd, fd, source.nbytes - done, source.offset + done, offset + done)
        except OSError as exc:
            if exc.errno not in _NO_KERNEL_COPY or done:
                raise
            _kernel_copy = False
            return False
        if copied == 0:
            raise CheckpointError(f"an input file ended {source.nbytes - done} bytes early while copying; it "
                                  "changed during the build.")
        done += copied
    return done == source.nbytes


class SafetensorsWriter:
    """Writes one safetensors file whose layout is fixed up front.

    Arguments:
        path: the file to create.
        entries: (name, dtype, shape) in file order.
        metadata: optional string metadata for the header.
    """

    def __init__(self, path: Path, entries: list[tuple[str, torch.dtype, tuple[int, ...]]],
                 metadata: dict[str, str] | None = None) -> None:
        self.path = path
        self._layout: dict[str, tuple[torch.dtype, tuple[int, ...], int, int]] = {}
        header: dict[str, object] = {"__metadata__": metadata} if metadata else {}
        offset = 0
        for name, dtype, shape in entries:
            nbytes = _numel(shape) * torch.empty((), dtype=dtype).element_size()
            header[name] = {"dtype": DTYPE_CODES[dtype], "shape": list(shape),
                            "data_offsets": [offset, offset + nbytes]}
            self._layout[name] = (dtype, tuple(shape), offset, nbytes)
            offset += nbytes
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)
        self._data_start = 8 + len(blob)
        self._pending = set(self._layout)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        write_all(self._fd, memoryview(struct.pack("<Q", len(blob)) + blob), 0)

    def write(self, name: str, parts: torch.Tensor | list[torch.Tensor],
              locate: Callable[[torch.Tensor], FileSlice | None] | None = None) -> None:
        """Write one tensor, given whole or as parts that concatenate along dim 0 to the declared shape.

        Arguments:
            name: a declared tensor.
            parts: the tensor, or its parts.
            locate: a part → the input file bytes it is equal to, if any; those are copied by the kernel.
        """
        dtype, shape, offset, _ = self._layout[name]
        parts = [parts] if isinstance(parts, torch.Tensor) else parts
        if not shape:  # a scalar is written whole
            parts = [p.reshape(()) for p in parts if p.numel() == 1][:1] or parts
        rows = sum(p.shape[0] if p.dim() else 1 for p in parts)
        if any(p.dtype != dtype or tuple(p.shape[1:]) != shape[1:] for p in parts) or rows != (shape or (1,))[0]:
            found = [(p.dtype, tuple(p.shape)) for p in parts]
            raise CheckpointError(f"{name}: produced {found}, declared {dtype} {shape}.")
        position = self._data_start + offset
        for part in parts:
            source = locate(part) if locate else None
            if source is None or not copy_slice(source, self._fd, position):
                data = memoryview(part.contiguous().reshape(-1).view(torch.uint8).numpy().data)
                write_all(self._fd, data, position)
            position += part.numel() * part.element_size()
        self._pending.discard(name)

    def claim(self, name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> tuple[int, int]:
        """``(fd, file offset)`` where tensor ``name`` goes, for a caller that writes its bytes itself (``pwrite``,
        from several threads); the tensor counts as written, so the caller must write all of it or fail.

        Arguments:
            name: a declared tensor; dtype, shape: what the caller will write (checked against the declaration).
        """
        declared, declared_shape, offset, _ = self._layout[name]
        if dtype != declared or tuple(shape) != declared_shape:
            raise CheckpointError(f"{name}: produced {dtype} {tuple(shape)}, declared {declared} {declared_shape}.")
        self._pending.discard(name)
        return self._fd, self._data_start + offset

    def __enter__(self) -> SafetensorsWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        """Close the file; on success every declared tensor must have been written."""
        os.close(self._fd)
        if exc_type is None and self._pending:
            raise CheckpointError(f"{self.path.name}: tensors never written: {sorted(self._pending)[:5]}.")


def write_all(fd: int, data: memoryview, offset: int) -> None:
    """``pwrite`` all of ``data`` at ``offset``.

    Arguments:
        fd: the file; data: the bytes; offset: where.
    """
    while data:
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for dim in shape:
        n *= dim
    return n
