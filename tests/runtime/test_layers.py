"""The per-step shortcuts of the layer math give the bits the plain computation gives."""

from __future__ import annotations

import pytest
import torch

from trtllm_kit.runtime.layers import Rope, reduce


def fresh_rotation(config: dict, x: torch.Tensor, positions: torch.Tensor, seq_len: int) -> torch.Tensor:
    """The rotation by a Rope that has computed nothing before."""
    return Rope(config, x.shape[-1]).rotate(x, positions.clone(), seq_len)


@pytest.mark.parametrize("config", [{"rotary_base": 10000.0},
                                    {"rotary_scaling": {"type": "dynamic", "factor": 2.0},
                                     "max_position_embeddings": 16}])
def test_kept_angles_rotate_as_fresh_ones(config):
    torch.manual_seed(0)
    rope = Rope(config, 8)
    x = torch.randn(2, 3, 5, 8)
    first, second = torch.arange(10).reshape(2, 5), torch.arange(20, 30).reshape(2, 5)
    # the same tensor again (the layers of one step), another tensor, the first again with a longer sequence
    for positions, seq_len in ((first, 10), (first, 10), (second, 30), (first, 40), (first, 10)):
        assert torch.equal(rope.rotate(x, positions, seq_len), fresh_rotation(config, x, positions, seq_len))


def test_dynamic_frequencies_past_the_trained_length_differ_from_those_within():
    rope = Rope({"rotary_scaling": {"type": "dynamic", "factor": 2.0}, "max_position_embeddings": 16}, 8)
    assert torch.equal(rope.inv_freq(4), rope.inv_freq(16))
    assert not torch.equal(rope.inv_freq(16), rope.inv_freq(40))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_one_rank_reduction_rounds_as_the_stacked_sum(dtype):
    partial = torch.tensor([[-0.0, 0.0, 1.5, -2.25, 3e-5, float("inf")]], dtype=dtype)
    want = torch.stack([partial.float()]).sum(0).to(dtype)
    got = reduce([partial])
    assert got.dtype == dtype
    assert torch.equal(got, want) and torch.equal(torch.signbit(got), torch.signbit(want))
    bias = torch.ones(6, dtype=dtype)
    assert torch.equal(reduce([partial], bias), want + bias)
