"""A GGUF file's header: metadata and tensor table, read within bounds before anything is allocated.

A GGUF header is counts and lengths followed by what they count. A file that claims 2**60 metadata entries, a
string of 2**40 bytes or a tensor past its end would, read trustingly, take the memory or time the numbers say. Here
every count and length is held to a bound (``HeaderBounds``) and to the bytes the file still has before it is
acted on, so a hostile or truncated file is refused in one sentence after reading at most ``max_header_bytes``.
Only GGUF versions 2 and 3, little-endian (every file llama.cpp has written since 2023), are read.
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trtllm_kit.errors import ModelError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
STRING, ARRAY = 8, 9
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
NUMPY_TYPES = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8",
               11: "<i8", 12: "<f8"}


@dataclass(frozen=True)
class HeaderBounds:
    """The largest header the kit reads. Real files: llama-family GGUFs hold 25-60 metadata entries and 100-1,200
    tensors; the largest vocabularies (256k tokens, 500k merges) are the longest arrays; chat templates are under
    32 KiB; a whole header (a 256k vocabulary included) is under 20 MiB."""

    max_metadata_entries: int = 4096
    max_tensors: int = 65536
    max_string_bytes: int = 1 << 20
    max_array_items: int = 1 << 22
    max_dims: int = 4
    max_header_bytes: int = 256 << 20


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of the table: its dims in GGUF order (``dims[0]`` is the row length), ggml type and bytes."""

    name: str
    dims: tuple[int, ...]
    type_code: int
    offset: int  # from the start of the file
    nbytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape as torch and safetensors write it (rows first)."""
        return tuple(reversed(self.dims))


@dataclass(frozen=True)
class GGUFHeader:
    """What a GGUF file says about itself; tensors are in file order."""

    path: Path
    version: int
    metadata: dict[str, Any]  # strings, numbers, bools; arrays as lists (strings) or numpy arrays (numbers)
    tensors: dict[str, GGUFTensor]
    file_size: int

    @property
    def architecture(self) -> str:
        value = self.metadata.get("general.architecture")
        if not isinstance(value, str):
            raise ModelError(f"{self.path} has no general.architecture string; it is not a model GGUF file.")
        return value


class _Cursor:
    """Reads the header out of a mapped file, each length checked against what the file still holds."""

    def __init__(self, path: Path, data: mmap.mmap, bounds: HeaderBounds) -> None:
        self.path, self.data, self.bounds, self.pos = path, data, bounds, 0
        self.end = min(len(data), bounds.max_header_bytes)

    def take(self, size: int, what: str) -> int:
        """The offset of the next ``size`` bytes (``what`` names them for the refusal)."""
        if self.pos + size > self.end:
            if self.end < len(self.data):
                raise ModelError(f"{self.path}: the header runs past {self.bounds.max_header_bytes} bytes at {what}; "
                                 "no llama-family GGUF has a header that large: the file is damaged or hostile: "
                                 "use one from a source you trust.")
            raise ModelError(f"{self.path} is truncated: {what} needs {size} bytes at offset {self.pos}, past the "
                             f"file's {len(self.data)} bytes; download the file again.")
        start, self.pos = self.pos, self.pos + size
        return start

    def scalar(self, fmt: str, what: str) -> Any:
        return struct.unpack_from(fmt, self.data, self.take(struct.calcsize(fmt), what))[0]

    def count(self, bound: int, what: str) -> int:
        value = int(self.scalar("<Q", what))
        if value > bound:
            raise ModelError(f"{self.path}: {what} is {value}, above the bound of {bound}; no llama-family GGUF "
                             "has that many: the file is damaged or hostile: use one from a source you trust.")
        return value

    def string(self, what: str) -> str:
        size = self.count(self.bounds.max_string_bytes, f"the length of {what}")
        raw = self.data[self.take(size, what):self.pos]
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ModelError(f"{self.path}: {what} is not UTF-8 text; the file is damaged: "
                             "download or convert it again.") from None

    def name(self, what: str) -> str:
        """A key or tensor name: a string of printable characters (messages quote it as it is)."""
        text = self.string(what)
        if not text.isprintable():
            raise ModelError(f"{self.path}: {what} is {text[:80]!r}, which holds control characters; the file is "
                             "damaged: download or convert it again.")
        return text

    def value(self, type_code: int, what: str) -> Any:
        if type_code == STRING:
            return self.string(what)
        if type_code in SCALARS:
            return self.scalar(SCALARS[type_code], what)
        if type_code != ARRAY:
            raise ModelError(f"{self.path}: {what} has value type {type_code}, which GGUF does not define; the file "
                             "is damaged: download or convert it again.")
        item_type = int(self.scalar("<I", f"the item type of {what}"))
        num_items = self.count(self.bounds.max_array_items, f"the item count of {what}")
        if item_type == STRING:
            return [self.string(f"item {i} of {what}") for i in range(num_items)]
        if item_type not in NUMPY_TYPES:
            raise ModelError(f"{self.path}: {what} is an array of type {item_type}; the kit reads arrays of "
                             "numbers and strings only.")
        dtype = np.dtype(NUMPY_TYPES[item_type])
        start = self.take(num_items * dtype.itemsize, what)
        return np.frombuffer(self.data, dtype=dtype, count=num_items, offset=start).copy()


def read_header(path: Path, bounds: HeaderBounds | None = None) -> GGUFHeader:
    """The metadata and tensor table of a GGUF file, every count and length checked before it is used.

    Arguments:
        path: a regular file (a FIFO, device or socket is refused without blocking).
        bounds: the limits (default ``HeaderBounds()``).
    """
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    bounds = bounds or HeaderBounds()
    fd = _open_regular(path)
    try:
        size = os.fstat(fd).st_size
        if size < 24:
            raise ModelError(f"{path} is {size} bytes, too short for a GGUF header; it is truncated or not GGUF.")
        data = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    with data:
        if data[:4] != MAGIC:
            raise ModelError(f"{path} does not begin with GGUF's magic bytes (found {bytes(data[:4])!r}); give a "
                             "GGUF file or a Hugging Face model directory.")
        cur = _Cursor(path, data, bounds)
        cur.take(4, "the magic")
        version = int(cur.scalar("<I", "the version"))
        if version not in VERSIONS:
            raise ModelError(f"{path} is GGUF version {version}; the kit reads versions 2 and 3 (little-endian): "
                             "convert it again with a current llama.cpp.")
        num_tensors = cur.count(bounds.max_tensors, "the tensor count")
        num_entries = cur.count(bounds.max_metadata_entries, "the metadata entry count")
        metadata: dict[str, Any] = {}
        for index in range(num_entries):
            key = cur.name(f"the key of metadata entry {index}")
            metadata[key] = cur.value(int(cur.scalar("<I", f"the type of {key}")), key)
        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment < 1 or alignment & (alignment - 1) or alignment > 1 << 20:
            raise ModelError(f"{path}: general.alignment is {alignment!r}, not a power of two up to 1 MiB; the file "
                             "is damaged: download or convert it again.")
        table = [_tensor_entry(cur, index) for index in range(num_tensors)]
        data_start = cur.pos + (-cur.pos % alignment)
    tensors: dict[str, GGUFTensor] = {}
    for name, dims, type_code, relative in table:
        if type_code not in GGML_QUANT_SIZES:
            raise ModelError(f"{path}: tensor {name} has ggml type {type_code}, which the gguf package does not "
                             "know; update gguf (pip install -U gguf) or convert the model again.")
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(type_code)]
        if dims[0] % block:
            raise ModelError(f"{path}: tensor {name} has rows of {dims[0]} values, not a multiple of the {block}-value "
                             f"blocks of type {GGMLQuantizationType(type_code).name}; the file is damaged: "
                             "download or convert it again.")
        nbytes = int(np.prod(dims, dtype=object)) // block * block_bytes
        start = data_start + relative
        if relative % alignment or start + nbytes > size:
            raise ModelError(f"{path} is truncated or damaged: tensor {name} ({nbytes} bytes at offset {start}) "
                             f"does not lie within the file's {size} bytes; download the file again.")
        if name in tensors:
            raise ModelError(f"{path} holds tensor {name} twice; the file is damaged: download or convert it again.")
        tensors[name] = GGUFTensor(name, dims, type_code, start, nbytes)
    return GGUFHeader(path, version, metadata, tensors, size)


def _tensor_entry(cur: _Cursor, index: int) -> tuple[str, tuple[int, ...], int, int]:
    name = cur.name(f"the name of tensor {index}")
    num_dims = int(cur.scalar("<I", f"the dimension count of {name}"))
    if not 1 <= num_dims <= cur.bounds.max_dims:
        raise ModelError(f"{cur.path}: tensor {name} has {num_dims} dimensions; the kit reads 1 to "
                         f"{cur.bounds.max_dims}.")
    dims = tuple(int(cur.scalar("<Q", f"a dimension of {name}")) for _ in range(num_dims))
    if min(dims) < 1:
        raise ModelError(f"{cur.path}: tensor {name} has dimensions {list(dims)}; a weight has none of size 0.")
    return name, dims, int(cur.scalar("<I", f"the type of {name}")), int(cur.scalar("<Q", f"the offset of {name}"))


def _open_regular(path: Path) -> int:
    """A descriptor of ``path`` when it is a regular file; opened non-blocking, so a FIFO never blocks."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise ModelError(f"cannot open {path} ({exc.strerror}); give a readable GGUF file.") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ModelError(f"{path} is not a regular file; give the GGUF file itself.")
    return fd
