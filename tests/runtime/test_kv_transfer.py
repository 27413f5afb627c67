"""The K/V hand-off between two engines in the paged layout: a context engine holds a finished context-only
sequence's blocks until released; a generation engine of another TP split and block size installs them and
continues token-exactly against one engine running the whole request; what cannot match is refused, a wire header
before anything is allocated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trtllm_kit.errors import KitUsageError
from trtllm_kit.llmapi.load import load_unified
from trtllm_kit.llmapi.unified import write_unified
from trtllm_kit.mapping import Mapping
from trtllm_kit.models.inspect import inspect_model
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.executor import Executor
from trtllm_kit.runtime.kv_transfer import KvBlocks, KvLayout, decode, decode_header
from trtllm_kit.runtime.sequence import SamplingParams

torch.set_num_threads(1)
PROMPTS = [list(range(3, 70)), [5] * 32, list(range(300, 301)), list(range(10, 140))]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ckpt")
    write_unified(inspect_model("builtin:tiny-llama"), out, "float32")
    return out


def drain(engine: Executor) -> None:
    for _ in range(1000):
        if not engine.has_work():
            return
        engine.step()
    raise AssertionError("the engine did not finish")


@pytest.mark.parametrize(("tp_size", "generation_config"), [
    (1, EngineConfig()),
    (2, EngineConfig(tokens_per_block=16, enable_kv_cache_reuse=False)),
    (2, EngineConfig(tokens_per_block=8, batch_scheduler_policy="max_utilization", max_tokens_in_paged_kv_cache=512)),
])
def test_generation_continues_token_exactly_from_transferred_blocks(ckpt, tp_size, generation_config):
    context = Executor(load_unified(ckpt), EngineConfig(enable_chunked_context=True, max_num_tokens=48))
    generation = Executor(load_unified(ckpt, Mapping(tp_size, 1)), generation_config)
    free = context.stats().blocks_free
    for prompt in PROMPTS:
        expected = Executor(load_unified(ckpt), EngineConfig()).generate([prompt], [SamplingParams(max_tokens=12,
                                                                                                 top_k=1)])[0]
        seq = context.add_request(prompt, SamplingParams(max_tokens=1, top_k=1), hold_kv=True)
        drain(context)
        assert seq.output_ids == expected[:1] and seq.seq_id in context.scheduler.held
        assert context.stats().blocks_free < free  # held after the request finished
        sent = context.export_kv(seq).encode()
        context.release(seq)
        assert context.stats().blocks_free == free
        line, rest = sent.split(b"\n", 1)
        header, size = decode_header(line, KvLayout.of(generation.k_cache), len(prompt))
        kv = decode(header, rest[:size], rest[size:])
        resumed = generation.add_request(prompt, SamplingParams(max_tokens=12, top_k=1),
                                         prefilled=(seq.output_ids, kv))
        drain(generation)
        assert resumed.output_ids == expected, prompt
    assert generation.stats().blocks_used == 0


def test_what_cannot_continue_is_refused(ckpt):
    context = Executor(load_unified(ckpt), EngineConfig())
    seq = context.add_request(PROMPTS[0], SamplingParams(max_tokens=1, top_k=1), hold_kv=True)
    drain(context)
    kv = context.export_kv(seq)
    with pytest.raises(KitUsageError, match="holds 67 tokens but the prompt has 66"):
        context.add_request(PROMPTS[0][:-1], SamplingParams(max_tokens=4), prefilled=(seq.output_ids, kv))
    with pytest.raises(KitUsageError, match="samples one sequence"):
        context.add_request(PROMPTS[0], SamplingParams(max_tokens=4, n=2, top_k=0, temperature=1.0),
                            prefilled=(seq.output_ids, kv))
    narrow = KvBlocks(kv.num_tokens, kv.tokens_per_block, kv.k[..., :4], kv.v[..., :4])
    with pytest.raises(KitUsageError, match="serve the same checkpoint and dtype in both roles"):
        context.add_request(PROMPTS[0], SamplingParams(max_tokens=4), prefilled=(seq.output_ids, narrow))
    with pytest.raises(KitUsageError, match="serve the same checkpoint and dtype in both roles"):
        context.add_request(PROMPTS[0], SamplingParams(max_tokens=4), prefilled=(seq.output_ids, KvBlocks(
            kv.num_tokens, kv.tokens_per_block, kv.k.half(), kv.v.half())))
    done = Executor(load_unified(ckpt), EngineConfig()).add_request(
        PROMPTS[0], SamplingParams(max_tokens=1), prefilled=(seq.output_ids, kv))
    assert done.is_finished and done.output_ids == seq.output_ids  # its first token completes it


LAYOUT = KvLayout(num_layers=3, num_kv_heads=2, head_size=64, dtype=torch.float32)
GOOD = {"num_tokens": 40, "tokens_per_block": 32, "dtype": "float32", "shape": [3, 2, 64, 1, 64]}


@pytest.mark.parametrize(("change", "said"), [
    ({"shape": [1e30, 2, 64, 1, 64]}, r"shape is \[1e\+30"),
    ({"shape": [2 ** 10, 2 ** 10, 2 ** 10, 2 ** 10, 2 ** 6]}, r"shape is \[1024"),
    ({"shape": [3, 2, -64, 1, 64]}, r"shape is \[3, 2, -64"),
    ({"shape": [True, 2, 64, 1, 64]}, r"shape is \[True"),
    ({"shape": [3, 2, 64, 1]}, r"shape is \[3, 2, 64, 1\], not \[3, tp, 64, 2 / tp, 64\]"),
    ({"shape": [3, 3, 64, 1, 64]}, "shape is"),  # 3 ranks cannot split 2 KV heads
    ({"shape": [3, 2, 64, 2, 64]}, "shape is"),  # 4 KV heads
    ({"shape": [3, 2, 64, 1, 32]}, "shape is"),  # head size
    ({"shape": [4, 2, 64, 1, 64]}, "shape is"),  # layers
    ({"shape": [3, 2, 96, 1, 64]}, "shape is"),  # a block more than 40 tokens fill
    ({"shape": "3,2,64,1,64"}, "shape is"),
    ({"dtype": "float16"}, "dtype is 'float16', this engine's 'float32'"),
    ({"num_tokens": 41}, "num_tokens is 41, but the prompt has 40"),
    ({"num_tokens": "40"}, "num_tokens is 40, but"),
    ({"tokens_per_block": 0}, r"tokens_per_block is 0, outside \[1, 4096\]"),
    ({"tokens_per_block": 10 ** 6}, "tokens_per_block is 1000000"),
    ({"extra": 1}, "does not hold exactly num_tokens, tokens_per_block, dtype, shape"),
])
def test_a_header_that_does_not_fit_the_pool_is_refused_before_allocating(change, said):
    with pytest.raises(KitUsageError, match=said):
        decode_header(json.dumps({**GOOD, **change}).encode(), LAYOUT, 40)


def test_a_header_line_that_is_not_one_is_refused():
    assert decode_header(json.dumps(GOOD).encode(), LAYOUT, 40) == (GOOD, 3 * 2 * 64 * 1 * 64 * 4)
    for line, said in ((b"[" * 1000, "is not JSON"), (b"[1, 2]", "does not hold exactly"),
                       (json.dumps({**GOOD, "pad": "x" * 2000}).encode(), "more than 1024")):
        with pytest.raises(KitUsageError, match=said):
            decode_header(line, LAYOUT, 40)
