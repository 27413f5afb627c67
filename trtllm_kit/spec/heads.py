"""What speculative heads (Medusa's, EAGLE-1's) add to the target's TensorRT-LLM checkpoint, said once for the
checkpoint writer and the plan: a table of tensors, their bytes on a rank, the manifest's record and the keys
``config.json`` gains (``spec.medusa_heads``, ``spec.eagle_heads``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from trtllm_kit.layout import shard_shape
from trtllm_kit.models.base import Split


class HeadTensor(NamedTuple):
    """One tensor the heads add to the checkpoint: its sources (in the heads file, or the base's when ``from_base``;
    several are concatenated along dim 0), its name there, its whole shape and split."""

    sources: tuple[str, ...]
    name: str
    shape: tuple[int, ...]
    split: Split
    from_base: bool = False


class SpeculativeHeads(Protocol):
    """Checked heads, ready to be written beside the base's weights."""

    @property
    def weights(self) -> Path:
        """The heads' safetensors file."""

    def tensors(self) -> list[HeadTensor]:
        """The table of the tensors the heads add to every rank file."""

    def record(self) -> dict[str, Any]:
        """What the manifest keeps of the heads."""

    def config_keys(self, base: dict[str, Any], draft_len: int) -> dict[str, Any]:
        """What the checkpoint's ``config.json`` gains over the base's ``base``, for ``draft_len`` drafts."""


def rank_numel(heads: SpeculativeHeads, tp_size: int) -> int:
    """Elements of the heads on one rank (every pipeline stage holds all of them).

    Arguments:
        heads: the checked heads; tp_size: tensor-parallel size.
    """
    return sum(math.prod(shard_shape(t.shape, t.split, tp_size)) for t in heads.tensors())
