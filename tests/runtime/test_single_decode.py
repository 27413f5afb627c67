"""The batch-1 decode step (``runtime/single_decode.py``) gives the general step's bits: tokens, cumulative logprobs
and every kept logprob, over consecutive and gathered key slots, in float32 and narrower dtypes; checkpoints it does
not cover take the general step."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from step_bits import load, output_bits

from trtllm_kit.quant.algos import QuantConfig
from trtllm_kit.runtime import single_decode
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.executor import Executor
from trtllm_kit.runtime.layers import linear, product_layout, reduce
from trtllm_kit.runtime.model import CheckpointModel
from trtllm_kit.runtime.products import LinearWeight, pack
from trtllm_kit.runtime.sequence import SamplingParams

torch.set_num_threads(1)


def outputs(model: CheckpointModel, use_single: bool) -> list[tuple[Any, ...]]:
    """Four requests on a 4-sequence engine (the longest decodes alone at the end), then two one after the other on
    a 1-sequence engine of 8 blocks (the second's blocks wrap around the pool: gathered slots); every output's
    bits."""
    engine = Executor(model, EngineConfig(max_batch_size=4, max_num_tokens=32, tokens_per_block=8,
                                          max_tokens_in_paged_kv_cache=512, enable_chunked_context=True))
    alone = Executor(model, EngineConfig(max_batch_size=1, tokens_per_block=8, max_tokens_in_paged_kv_cache=64))
    if not use_single:
        engine.single_decode = alone.single_decode = None
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, model.dims.vocab_size, (n,), generator=g).tolist() for n in (5, 37, 12, 20)]
    params = [SamplingParams(max_tokens=n, ignore_eos=True, logprobs=2, temperature=t, top_k=k, seed=3)
              for n, t, k in ((12, 1.0, 0), (9, 0.8, 20), (26, 1.0, 0), (7, 1.0, 5))]
    seqs = [engine.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
    for executor, prompt, sp in ((engine, None, None), (alone, prompts[0], params[0]),
                                 (alone, prompts[1], SamplingParams(max_tokens=10, ignore_eos=True, prompt_logprobs=1,
                                                                    logprobs=3))):
        if prompt is not None and sp is not None:
            seqs.append(executor.add_request(prompt, sp))
        while executor.has_work():
            executor.step()

    return output_bits(seqs)


@pytest.mark.parametrize("name, dtype, convert", [
    ("tiny-llama", "float32", {}), ("tiny-llama", "bfloat16", {}), ("tiny-llama", "float16", {}),
    ("tiny-llama", "float32", {"pp_size": 2}), ("tiny-qwen2", "float32", {}),  # stages; q/k/v biases
])
def test_single_decode_gives_the_general_steps_bits(tmp_path, monkeypatch, name, dtype, convert):
    model = load(tmp_path, name, dtype, **convert)
    calls = {"decode": 0, "gathered": 0}
    decode, gather = single_decode.SingleDecode.decode, single_decode.Gathered.__getitem__

    def counted_decode(self: single_decode.SingleDecode, seq: Any) -> torch.Tensor:
        calls["decode"] += 1
        return decode(self, seq)

    def counted_gather(self: single_decode.Gathered, layer: int) -> torch.Tensor:
        calls["gathered"] += 1
        return gather(self, layer)
    monkeypatch.setattr(single_decode.SingleDecode, "decode", counted_decode)
    monkeypatch.setattr(single_decode.Gathered, "__getitem__", counted_gather)
    general = outputs(model, use_single=False)
    assert calls == {"decode": 0, "gathered": 0}
    assert outputs(model, use_single=True) == general
    assert calls["decode"] >= 14 + 11 + 9 and calls["gathered"] > 0  # the longest request's steps alone, the others


@pytest.mark.parametrize("convert", [{"tp_size": 2}, {"quant": QuantConfig(quant="int8-wo", kv_cache="int8",
                                                                          calib_samples=2, calib_seq_len=32)}])
def test_checkpoints_it_does_not_cover_take_the_general_step(tmp_path, convert):
    model = load(tmp_path, "tiny-llama", **convert)
    assert single_decode.plain_layers(model) is None
    assert Executor(model, EngineConfig(max_batch_size=1)).single_decode is None


def test_a_plain_checkpoint_is_covered(tmp_path):
    model = load(tmp_path, "tiny-llama")
    layers = single_decode.plain_layers(model)
    assert layers is not None and len(layers) == model.dims.num_layers
    assert Executor(model, EngineConfig(max_batch_size=1)).single_decode is not None


@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("in_size", [64, 576, 1536])
def test_an_added_product_rounds_as_the_stream_plus_the_reduced_partial(in_size, rows):
    """On a stream free of -0.0, ``add_product`` is ``hidden + reduce([x @ w])``, zero and -0.0 products too, with
    the weight laid out as the layers hold it (``product_layout``: [in, out] row by row) and with its packed copy
    (the general step's ``linear`` multiplies the same way)."""
    torch.manual_seed(in_size)
    weight = product_layout(torch.randn(96, in_size)).t()
    x = torch.randn(rows, in_size) * 10
    x[:, in_size // 2:] = 0.0
    weight[: in_size // 2, :8] = -0.0  # columns whose products are all zeros (x is 0 in the other rows)
    packed = pack(weight.t())
    hidden = torch.randn(rows, 96)
    hidden[:, :4] = 0.0
    for copy in (None, packed):
        weights = {"w.weight": weight.t()} if copy is None else {"w.weight": weight.t(), "w.weight.packed": copy}
        want = hidden + reduce([linear(x, weights, "w")])
        got = hidden.clone()
        single_decode.add_product(got, x, LinearWeight(weight.t(), copy))
        assert torch.equal(got, want) and torch.equal(torch.signbit(got), torch.signbit(want))
    if rows == 1:  # one row: MKL's product, packed copy or not
        assert torch.equal(linear(x, {"w.weight": weight.t(), "w.weight.packed": packed}, "w"), torch.mm(x, weight))
