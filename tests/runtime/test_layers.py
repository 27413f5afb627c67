"""The per-step shortcuts of the layer math give the bits the plain computation gives."""

from __future__ import annotations

import pytest
import torch

from trtllm_kit.quant import decoder_layer
from trtllm_kit.runtime.layers import Rope, fuse_gate_up, linear, product_layout, reduce, rms_norm


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


def test_rotation_rounds_as_the_plain_formula():
    torch.manual_seed(0)
    rope, x = Rope({"rotary_base": 10000.0}, 64), torch.randn(1, 12, 7, 64) * 100
    positions = torch.arange(40, 47)[None]
    cos, sin = rope.angles(positions, 47)
    plain = x * cos + torch.cat((-x[..., 32:], x[..., :32]), dim=-1) * sin
    for _ in range(2):  # fresh, then with the kept signed sines
        assert torch.equal(rope.rotate(x, positions, 47), plain)


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 7, 130])
def test_rms_norm_rounds_as_transformers_arithmetic(dtype, tokens):
    torch.manual_seed(tokens)
    for hidden, magnitude in ((64, 1e-3), (576, 1.0), (2048, 1e3)):
        x, weight = (torch.randn(2, tokens, hidden) * magnitude).to(dtype), torch.randn(hidden).to(dtype)
        assert torch.equal(rms_norm(x, weight, 1e-5), decoder_layer.rms_norm(x, weight, 1e-5))


def gate_up_weights(**extra: torch.Tensor) -> dict[str, torch.Tensor]:
    """Two weights as ``prepare_weights`` holds them (``product_layout``)."""
    torch.manual_seed(0)
    return {"transformer.layers.0.mlp.fc.weight": product_layout(torch.randn(96, 64)),
            "transformer.layers.0.mlp.gate.weight": product_layout(torch.randn(96, 64)), **extra}


@pytest.mark.parametrize("tokens", [1, 5, 33])
def test_fused_gate_up_gives_each_linears_bits_and_holds_the_weights_once(tokens):
    weights = gate_up_weights()
    plain = dict(weights)
    fused = fuse_gate_up(weights, "transformer.layers.0")
    assert fused is not None and fused.shape == (192, 64)
    x = torch.randn(1, tokens, 64)
    fc, gate = torch.nn.functional.linear(x, fused).chunk(2, dim=-1)
    assert torch.equal(fc, linear(x, plain, "transformer.layers.0.mlp.fc"))
    assert torch.equal(gate, linear(x, plain, "transformer.layers.0.mlp.gate"))
    for name in ("fc", "gate"):  # the entries are views of the fused tensor, with the values they had
        entry = weights[f"transformer.layers.0.mlp.{name}.weight"]
        assert entry.untyped_storage().data_ptr() == fused.untyped_storage().data_ptr()
        assert torch.equal(entry, plain[f"transformer.layers.0.mlp.{name}.weight"])


@pytest.mark.parametrize("weights", [
    {"transformer.layers.0.mlp.fc.weight": torch.zeros(192, 64)},  # swiglu: both halves in mlp.fc
    {"transformer.layers.0.mlp.fc.weight": torch.zeros(96, 64, dtype=torch.int8),
     "transformer.layers.0.mlp.gate.weight": torch.zeros(96, 64, dtype=torch.int8)},
    {**gate_up_weights(), "transformer.layers.0.mlp.gate.bias": torch.zeros(96)},
], ids=["swiglu", "int8", "bias"])
def test_gate_up_is_not_fused_when_it_cannot_be(weights):
    before = dict(weights)
    assert fuse_gate_up(weights, "transformer.layers.0") is None
    assert all(weights[name] is tensor for name, tensor in before.items())
