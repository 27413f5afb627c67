"""Medusa heads in the TensorRT-LLM checkpoint: every rank file holds the heads' tensors beside the base's (the
table of ``spec.medusa_heads``, split as it says, in the checkpoint's dtype), and ``config.json`` names
``MedusaForCausalLM`` with the heads' counts once the base has been verified on the CPU (the CPU runtime runs the
base architecture, and the heads' extra tensors are not among the tensors it checks)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from trtllm_kit.layout import shard_shape
from trtllm_kit.spec.medusa_heads import HeadTensor, MedusaHeads


def heads_layout(heads: MedusaHeads, tp_size: int, dtype: torch.dtype) -> list[tuple[str, torch.dtype,
                                                                                      tuple[int, ...]]]:
    """The (name, dtype, shape) entries the heads add to each rank file (the same on every rank).

    Arguments:
        heads: the checked heads; tp_size: tensor-parallel size; dtype: the checkpoint's.
    """
    return [(t.name, dtype, shard_shape(t.shape, t.split, tp_size)) for t in heads.tensors()]


def iter_heads(heads: MedusaHeads, dtype: torch.dtype) -> Iterator[tuple[HeadTensor, torch.Tensor, torch.Tensor]]:
    """Each of the heads' tensors as read and in ``dtype``, one at a time.

    Arguments:
        heads: the checked heads; dtype: the checkpoint's.
    """
    with safe_open(str(heads.weights), framework="pt") as source:
        for row in heads.tensors():
            original = source.get_tensor(row.source)
            yield row, original, original.to(dtype)


def add_medusa_config(ckpt_dir: Path, heads: MedusaHeads, draft_len: int) -> None:
    """Turn the verified base's ``config.json`` into the Medusa model's (``MedusaConfig.to_dict``'s keys).

    Arguments:
        ckpt_dir: the checkpoint; heads: the heads written into it; draft_len: the engine's draft tokens per step.
    """
    path = ckpt_dir / "config.json"
    config = json.loads(path.read_text())
    config.update(heads.config_keys(draft_len))
    path.write_text(json.dumps(config, indent=4) + "\n")
