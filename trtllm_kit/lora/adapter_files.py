"""The files of an adapter, read as the kit reads every file someone else names (``safe_files``): regular files
inside the adapter's directory (a hub-cache snapshot's links may lead into its model folder, as they do by
design), each with a size bound, before a deadline.

- ``adapter_config.json``: at most ``CONFIG_MAX_BYTES`` (PEFT writes about one kilobyte).
- a safetensors file of A and B weights: a header of at most ``HEADER_BASE_BYTES`` plus ``HEADER_BYTES_PER_TENSOR``
  per tensor the base allows (A and B of each of its modules in each layer), at most that many tensors, and a file
  no larger than that header plus float32 A and B at the adapter's rank on every module of every layer. Each bound
  is checked before what it bounds is parsed or read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load

from trtllm_kit.models.inspect import model_root
from trtllm_kit.runtime.lora_modules import module_shapes
from trtllm_kit.safe_files import BoundedFile, UnsafeFileError, read_bounded

CONFIG_MAX_BYTES = 1 << 20
HEADER_BASE_BYTES = 64 << 10
HEADER_BYTES_PER_TENSOR = 512
ROWS_HEADER_BYTES = 4096  # an .npy file's header, padded


@dataclass(frozen=True)
class WeightsBound:
    """The most an adapter of one rank on one base may hold: tensors, header bytes, file bytes (safetensors) and
    row bytes (the engine's ``.npy`` rows, padded to the widest module)."""

    rank: int
    num_tensors: int
    header_bytes: int
    file_bytes: int
    rows_bytes: int

    @property
    def bounded_as(self) -> str:
        return f"a rank-{self.rank} adapter of this base (float32 A and B on every module of every layer)"


def weights_bound(base: dict[str, Any], rank: int) -> WeightsBound:
    """The bounds of an adapter of ``rank`` on the base whose sizes are ``base``.

    Arguments:
        base: the base checkpoint's ``config.json`` (or ``lora.settings.base_config``); rank: the adapter's rank.
    """
    shapes = module_shapes(base)
    layers = int(base["num_hidden_layers"])
    num_tensors = 2 * layers * len(shapes)
    header = HEADER_BASE_BYTES + HEADER_BYTES_PER_TENSOR * num_tensors
    data = 4 * rank * layers * sum(fan_in + fan_out for fan_in, fan_out in shapes.values())
    rows = ROWS_HEADER_BYTES + 4 * rank * layers * len(shapes) * max(i + o for i, o in shapes.values())
    return WeightsBound(rank, num_tensors, header, 8 + header + data, rows)


def adapter_root(adapter_dir: Path) -> Path:
    """The directory an adapter's files and their links must stay inside: the adapter directory, or for a hub-cache
    snapshot its model's cache folder."""
    return model_root(adapter_dir)


def read_config(path: Path) -> bytes:
    """The bytes of the adapter config ``path`` (at most ``CONFIG_MAX_BYTES``).

    Arguments:
        path: ``DIR/adapter_config.json``.
    """
    return read_bounded(path, root=adapter_root(path.parent), max_bytes=CONFIG_MAX_BYTES,
                        bounded_as=f"a PEFT {path.name}")


def read_weights(path: Path, bound: WeightsBound) -> tuple[bytes, dict[str, torch.Tensor]]:
    """The bytes of the safetensors file ``path`` and its tensors, each bound checked before the header is parsed
    or the data read.

    Arguments:
        path: an adapter's safetensors file; bound: what it may hold (``weights_bound``).
    """
    with BoundedFile(path, root=adapter_root(path.parent), max_bytes=bound.file_bytes,
                     bounded_as=bound.bounded_as) as file:
        head = file.read(8)
        header_size = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 <= header_size <= bound.header_bytes:
            raise UnsafeFileError(f"{path} has a header of {header_size} bytes, outside [0, {bound.header_bytes}] "
                                  f"for an adapter of this base (at most {bound.num_tensors} tensors); it is not an "
                                  "adapter of this model: save it again with PEFT.")
        header = file.read(header_size)
        num_tensors = _count_tensors(path, header)
        if num_tensors > bound.num_tensors:
            raise UnsafeFileError(f"{path} holds {num_tensors} tensors, above the {bound.num_tensors} an adapter of "
                                  "this base can have (A and B of each module in each layer); it is not an adapter "
                                  "of this model.")
        data = head + header + file.read_all()
    try:
        return data, load(data)
    except SafetensorError as exc:
        raise UnsafeFileError(f"{path} cannot be read as safetensors ({exc}).") from None


def read_rows(path: Path, bound: WeightsBound) -> bytes:
    """The bytes of an engine adapter's ``.npy`` file (at most ``bound.rows_bytes``).

    Arguments:
        path: ``OUT/lora/NAME/model.lora_*.npy``; bound: the adapter's bounds.
    """
    return read_bounded(path, root=path.parent, max_bytes=bound.rows_bytes, bounded_as=bound.bounded_as)


def _count_tensors(path: Path, header: bytes) -> int:
    try:
        entries = json.loads(header)
    except (ValueError, RecursionError):
        raise UnsafeFileError(f"{path} has a header that is not JSON; save the adapter again with PEFT.") from None
    if not isinstance(entries, dict):
        raise UnsafeFileError(f"{path} has a header that is not a JSON object; save the adapter again with PEFT.")
    return sum(1 for name in entries if name != "__metadata__")
