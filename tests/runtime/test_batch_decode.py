"""The decode step of several sequences (``runtime/batch_decode.py``) gives the general step's bits: tokens, cumulative
logprobs and every kept logprob, with keys of several lengths (several attention groups, masked padding), over
consecutive and wrapped-around slots, in float32 and narrower dtypes; checkpoints it does not cover take the general
step."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from step_bits import load, output_bits

from trtllm_kit.runtime import attention_groups, batch_decode
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.executor import Executor
from trtllm_kit.runtime.model import CheckpointModel
from trtllm_kit.runtime.sequence import SamplingParams

torch.set_num_threads(1)


def outputs(model: CheckpointModel, use_batch: bool) -> list[tuple[Any, ...]]:
    """Six requests of prompts from 3 to 41 tokens on a 6-sequence engine (decode steps of 2 to 6 sequences whose
    keys fall in several length groups), then four on a 4-sequence engine of 12 blocks (later blocks wrap around the
    pool: scattered slots); every output's bits. Only the general step runs unless ``use_batch``."""
    engines = [Executor(model, EngineConfig(max_batch_size=6, max_num_tokens=48, tokens_per_block=8,
                                            max_tokens_in_paged_kv_cache=512, enable_chunked_context=True)),
               Executor(model, EngineConfig(max_batch_size=4, tokens_per_block=4, max_tokens_in_paged_kv_cache=48))]
    for engine in engines:
        engine.single_decode = None
        if not use_batch:
            engine.batch_decode = None
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, model.dims.vocab_size, (n,), generator=g).tolist() for n in (5, 41, 12, 3, 20, 9)]
    params = [SamplingParams(max_tokens=n, ignore_eos=True, logprobs=2, temperature=t, top_k=k, seed=3)
              for n, t, k in ((14, 1.0, 0), (9, 0.8, 20), (26, 1.0, 0), (7, 1.0, 5), (18, 0.0, 0), (11, 1.0, 0))]
    seqs = [engines[0].add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
    seqs += [engines[1].add_request(p[:6], SamplingParams(max_tokens=5, ignore_eos=True, logprobs=1))
             for p in prompts[:4]]
    for engine in engines:
        while engine.has_work():
            engine.step()

    return output_bits(seqs)


@pytest.mark.parametrize("name, dtype, convert", [
    ("tiny-llama", "float32", {}), ("tiny-llama", "bfloat16", {}), ("tiny-llama", "float16", {}),
    ("tiny-llama", "float32", {"pp_size": 2}), ("tiny-qwen2", "float32", {}),  # stages; q/k/v biases
])
def test_batch_decode_gives_the_general_steps_bits(tmp_path, monkeypatch, name, dtype, convert):
    model = load(tmp_path, name, dtype, **convert)
    calls: dict[str, list[int]] = {"decode": [], "groups": [], "masked": []}
    decode, groups_of = batch_decode.BatchDecode.decode, attention_groups.attention_groups

    def counted_decode(self: batch_decode.BatchDecode, seqs: Any) -> torch.Tensor:
        calls["decode"].append(len(seqs))
        return decode(self, seqs)

    def counted_groups(*args: Any) -> list[attention_groups.Group]:
        groups = groups_of(*args)
        calls["groups"].append(len(groups))
        calls["masked"].append(sum(g.mask is not None for g in groups))
        return groups
    monkeypatch.setattr(batch_decode.BatchDecode, "decode", counted_decode)
    monkeypatch.setattr(batch_decode, "attention_groups", counted_groups)
    general = outputs(model, use_batch=False)
    assert calls["decode"] == []
    assert outputs(model, use_batch=True) == general
    assert len(calls["decode"]) >= 20 and set(calls["decode"]) >= {2, 3, 4, 5, 6}
    assert max(calls["groups"]) >= 2 and max(calls["masked"]) >= 1  # length groups apart, padded keys masked


def test_checkpoints_it_does_not_cover_take_the_general_step(tmp_path):
    model = load(tmp_path, "tiny-llama", tp_size=2)
    assert Executor(model, EngineConfig(max_batch_size=4)).batch_decode is None


def test_a_batch_of_one_or_with_a_context_chunk_is_not_its_step(tmp_path):
    model = load(tmp_path, "tiny-llama")
    engine = Executor(model, EngineConfig(max_batch_size=4, tokens_per_block=8))
    first = engine.add_request([1, 2, 3], SamplingParams(max_tokens=4))
    engine.step()  # the prompt
    assert not engine.batch_decode.can_decode([first], [first], [])  # one sequence: the batch-1 step's
    second = engine.add_request([4, 5, 6, 7], SamplingParams(max_tokens=4))
    seqs = engine.scheduler.schedule()
    assert seqs == [first, second] and second.num_scheduled_tokens == 4
    assert not engine.batch_decode.can_decode(seqs, seqs, [])  # a prompt in the step
    assert not engine.batch_decode.can_decode([first, first], [first, first], [first])  # a draft to verify
