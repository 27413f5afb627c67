"""A step skips work that changes nothing: the pool's per-layer parts are views taken once, and float32 tensors are
not converted to float32 again; other dtypes still compute in float32 and round back."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from trtllm_kit.checkpoint.convert import convert_checkpoint
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.executor import Executor
from trtllm_kit.runtime.layers import Rope, as_float32, attend
from trtllm_kit.runtime.model import CheckpointModel


@pytest.mark.parametrize("tp_size", [1, 2])
def test_kv_parts_are_the_pool_of_each_layer_and_rank(tmp_path: Path, tp_size: int) -> None:
    convert_checkpoint(builtin_dir("tiny-llama"), tmp_path / "ckpt", tp_size=tp_size, dtype="float32")
    executor = Executor(CheckpointModel.load(tmp_path / "ckpt"), EngineConfig(max_tokens_in_paged_kv_cache=64))
    assert len(executor.kv_parts) == executor.model.dims.num_layers
    for layer, ranks in enumerate(executor.kv_parts):
        assert len(ranks) == tp_size
        for rank, (k_part, v_part) in enumerate(ranks):
            k_part[3], v_part[5] = 1.0 + layer, 2.0 + rank  # written through the view ...
            assert torch.equal(executor.k_cache[layer, rank, 3], torch.full_like(k_part[3], 1.0 + layer))
            assert torch.equal(executor.v_cache[layer, rank, 5], torch.full_like(v_part[5], 2.0 + rank))
    assert int((executor.k_cache != 0).sum()) == executor.k_cache[0, 0, 3].numel() * len(executor.kv_parts) * tp_size


def test_as_float32_returns_a_float32_tensor_itself_and_converts_others() -> None:
    x = torch.randn(3, 4)
    assert as_float32(x) is x
    half = x.to(torch.bfloat16)
    converted = as_float32(half)
    assert converted.dtype == torch.float32 and torch.equal(converted, half.float())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_attention_and_rotation_keep_their_float32_arithmetic_and_the_input_dtype(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 4, 5, 8).to(dtype) for _ in range(3))
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * (1.0 / math.sqrt(8))
    probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1).to(dtype)
    out = attend(q, k, v, mask)
    assert out.dtype == dtype and torch.equal(out, torch.matmul(probs, v))
    rope = Rope({"rotary_base": 10000.0}, 8)
    positions = torch.arange(5)[None]
    rotated = rope.rotate(q, positions, 5)
    cos, sin = rope.angles(positions, 5)
    qf = q.float()
    want = (qf * cos + torch.cat((-qf[..., 4:], qf[..., :4]), dim=-1) * sin).to(dtype)
    assert rotated.dtype == dtype and torch.equal(rotated, want)
