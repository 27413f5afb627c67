"""What the decode paths' bit-equality tests share: a built-in model converted and loaded in a dtype, and every
output of a set of sequences as exact bits (tokens, cumulative logprob, each kept logprob and its alternatives)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import torch

from trtllm_kit.checkpoint.convert import convert_checkpoint
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.runtime.model import CheckpointModel
from trtllm_kit.runtime.sequence import Sequence


def load(tmp_path: Path, name: str, dtype: str = "float32", **convert: Any) -> CheckpointModel:
    """The built-in model ``name`` converted into ``tmp_path`` (``convert``: e.g. ``pp_size``), loaded in ``dtype``."""
    convert_checkpoint(builtin_dir(name), tmp_path / "ckpt", dtype=dtype, **convert)
    return CheckpointModel.load(tmp_path / "ckpt", getattr(torch, dtype))


def bits(x: float) -> str:
    """A float's exact bits (its IEEE double as hex)."""
    return struct.pack("<d", x).hex()


def output_bits(seqs: list[Sequence]) -> list[tuple[Any, ...]]:
    """Each sequence's tokens, cumulative logprob and kept logprobs, every float as its bits."""
    return [(s.output_ids, bits(s.cum_logprob), [(t.token_id, bits(t.logprob), t.top_ids,
                                                  [bits(v) for v in t.top_logprobs]) for t in s.output_logprobs])
            for s in seqs]
