"""Streaming safetensors: read headers without loading data, write a file tensor by tensor.

``safetensors.torch.save_file`` needs every tensor of a file in memory at once; a rank file of a 70B model
does not fit. The writer here lays out the header first (names, dtypes, shapes are known before any data)
and then writes each tensor at its offset as the converter produces it, so memory follows the largest
tensor, not the file.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import BinaryIO

import torch

from trtllm_kit.errors import CheckpointError

DTYPE_CODES: dict[torch.dtype, str] = {
    torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int8: "I8",
    torch.uint8: "U8", torch.int32: "I32", torch.int64: "I64", torch.float8_e4m3fn: "F8_E4M3",
    torch.bool: "BOOL", torch.float64: "F64",
}
DTYPES_BY_CODE = {code: dtype for dtype, code in DTYPE_CODES.items()}


def read_header(path: Path) -> dict[str, dict]:
    """The tensor entries of a safetensors file (name → dtype, shape, data_offsets), checked against its size.

    Arguments:
        path: the file.
    """
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path} is truncated ({size} bytes): not a safetensors file.")
        (length,) = struct.unpack("<Q", head)
        if length > min(size - 8, 100 * 1024 * 1024):
            raise CheckpointError(f"{path} is truncated or not a safetensors file (header of {length} bytes "
                                  f"in a file of {size}).")
        try:
            header = json.loads(f.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise CheckpointError(f"{path} has a corrupt safetensors header.") from None
    header.pop("__metadata__", None)
    data_size = size - 8 - length
    end = max((entry["data_offsets"][1] for entry in header.values()), default=0)
    if end > data_size:
        raise CheckpointError(f"{path} is truncated: its header describes {end} bytes of data but the file "
                              f"holds {data_size}; download or copy it again.")
    return header


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
        self._file: BinaryIO = path.open("wb")
        self._file.write(struct.pack("<Q", len(blob)) + blob)

    def write(self, name: str, parts: torch.Tensor | list[torch.Tensor]) -> None:
        """Write one tensor, given whole or as parts that concatenate along dim 0 to the declared shape.

        Tensors written in declaration order are appended; any other order seeks.
        """
        dtype, shape, offset, _ = self._layout[name]
        parts = [parts] if isinstance(parts, torch.Tensor) else parts
        rows = sum(p.shape[0] for p in parts)
        if any(p.dtype != dtype or tuple(p.shape[1:]) != shape[1:] for p in parts) or rows != shape[0]:
            found = [(p.dtype, tuple(p.shape)) for p in parts]
            raise CheckpointError(f"{name}: produced {found}, declared {dtype} {shape}.")
        position = self._data_start + offset
        if self._file.tell() != position:
            self._file.seek(position)
        for part in parts:
            self._file.write(memoryview(part.contiguous().reshape(-1).view(torch.uint8).numpy()))
        self._pending.discard(name)

    def __enter__(self) -> SafetensorsWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        """Close the file; on success every declared tensor must have been written."""
        self._file.close()
        if exc_type is None and self._pending:
            raise CheckpointError(f"{self.path.name}: tensors never written: {sorted(self._pending)[:5]}.")


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for dim in shape:
        n *= dim
    return n
