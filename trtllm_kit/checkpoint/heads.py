"""Speculative heads in the TensorRT-LLM checkpoint (Medusa's, EAGLE-1's): every rank file holds the heads' tensors
beside the base's (the heads' table, ``spec.heads``, split as it says, in the checkpoint's dtype), and ``config.json``
names the speculative architecture with the heads' keys once the base has been verified on the CPU (the CPU runtime
runs the base architecture, and the heads' extra tensors are not among the tensors it checks)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from trtllm_kit.layout import shard_shape
from trtllm_kit.spec.heads import HeadTensor, SpeculativeHeads


def heads_layout(heads: SpeculativeHeads, tp_size: int, dtype: torch.dtype) -> list[tuple[str, torch.dtype,
                                                                                           tuple[int, ...]]]:
    """The (name, dtype, shape) entries the heads add to each rank file (the same on every rank).

    Arguments:
        heads: the checked heads; tp_size: tensor-parallel size; dtype: the checkpoint's.
    """
    return [(t.name, dtype, shard_shape(t.shape, t.split, tp_size)) for t in heads.tensors()]


def iter_heads(heads: SpeculativeHeads, dtype: torch.dtype, read_base: Callable[[str], torch.Tensor],
               ) -> Iterator[tuple[HeadTensor, torch.Tensor, torch.Tensor]]:
    """Each of the heads' tensors as read (its sources concatenated) and in ``dtype``, one at a time.

    Arguments:
        heads: the checked heads; dtype: the checkpoint's; read_base: an HF name of the base → its tensor.
    """
    with safe_open(str(heads.weights), framework="pt") as source:
        for row in heads.tensors():
            parts = [read_base(name) if row.from_base else source.get_tensor(name) for name in row.sources]
            original = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
            yield row, original, original.to(dtype)


def add_heads_config(ckpt_dir: Path, heads: SpeculativeHeads, draft_len: int) -> None:
    """Turn the verified base's ``config.json`` into the speculative model's.

    Arguments:
        ckpt_dir: the checkpoint; heads: the heads written into it; draft_len: the engine's draft tokens per step.
    """
    path = ckpt_dir / "config.json"
    config = json.loads(path.read_text())
    config.update(heads.config_keys(config, draft_len))
    path.write_text(json.dumps(config, indent=4) + "\n")
