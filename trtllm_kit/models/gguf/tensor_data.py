"""One GGUF tensor's values: its bytes read from the file and dequantized by the ``gguf`` package.

Float types keep their precision (F16 stays float16, BF16 bfloat16); every quantized type comes out in float32,
which holds its dequantized values exactly. A type ``gguf`` cannot dequantize is refused by name.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import torch

from trtllm_kit.errors import ModelError
from trtllm_kit.models.gguf.header import GGUFHeader, GGUFTensor

F32, F16, BF16 = 0, 1, 30
NATIVE = {F32: torch.float32, F16: torch.float16, BF16: torch.bfloat16}


def type_name(type_code: int) -> str:
    """The ggml type's name (``Q4_K``), for messages."""
    from gguf.constants import GGMLQuantizationType

    return GGMLQuantizationType(type_code).name


@functools.cache
def can_dequantize(type_code: int) -> bool:
    """Whether the installed ``gguf`` package dequantizes this ggml type (tried on one block of zeros)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    if type_code in NATIVE:
        return True
    qtype = GGMLQuantizationType(type_code)
    try:
        dequantize(np.zeros((1, GGML_QUANT_SIZES[qtype][1]), dtype=np.uint8), qtype)
    except NotImplementedError:
        return False
    return True


def output_dtype(type_code: int) -> torch.dtype:
    """The dtype a tensor of this type is imported in."""
    return NATIVE.get(type_code, torch.float32)


def check_types(header: GGUFHeader) -> None:
    """Refuse the file, naming the first tensor, when any tensor has a type ``gguf`` does not dequantize.

    Arguments:
        header: the file's header.
    """
    for tensor in header.tensors.values():
        if not can_dequantize(tensor.type_code):
            raise ModelError(f"{header.path}: tensor {tensor.name} has type {type_name(tensor.type_code)}, which the "
                             "installed gguf package cannot dequantize; convert the model to another type (F16, "
                             "Q8_0, Q4_K, ...) or update gguf (pip install -U gguf).")


def read_tensor(header: GGUFHeader, tensor: GGUFTensor, fd: int) -> torch.Tensor:
    """The tensor's values in its import dtype (``output_dtype``), shaped rows first.

    Arguments:
        header: the file's header; tensor: one of its tensors; fd: the file, open for reading.
    """
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    raw = os.pread(fd, tensor.nbytes, tensor.offset)
    if len(raw) != tensor.nbytes:
        raise ModelError(f"{header.path} is truncated: tensor {tensor.name} has {len(raw)} of its {tensor.nbytes} "
                         "bytes; download the file again.")
    data = np.frombuffer(raw, dtype=np.uint8)
    if tensor.type_code in NATIVE:
        values = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(NATIVE[tensor.type_code])
        return values.reshape(tensor.shape)
    rows = int(np.prod(tensor.dims[1:], dtype=np.int64))  # 1 for a vector
    floats = dequantize(data.reshape(rows, -1), GGMLQuantizationType(tensor.type_code))
    return torch.from_numpy(np.ascontiguousarray(floats, dtype=np.float32)).reshape(tensor.shape)
