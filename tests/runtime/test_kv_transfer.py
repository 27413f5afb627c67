"""The K/V hand-off between two engines in the paged layout: a context engine holds a finished context-only
sequence's blocks until released; a generation engine of another TP split and block size installs them and
continues token-exactly against one engine running the whole request; what cannot match is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trtllm_kit.errors import KitUsageError
from trtllm_kit.layout import Mapping
from trtllm_kit.llmapi.load import load_unified
from trtllm_kit.llmapi.unified import write_unified
from trtllm_kit.models.inspect import inspect_model
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.engine import Engine
from trtllm_kit.runtime.kv_transfer import KvBlocks, decode, decode_header
from trtllm_kit.runtime.sequence import SamplingParams

torch.set_num_threads(1)
PROMPTS = [list(range(3, 70)), [5] * 32, list(range(300, 301)), list(range(10, 140))]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ckpt")
    write_unified(inspect_model("builtin:tiny-llama"), out, "float32")
    return out


def drain(engine: Engine) -> None:
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
    context = Engine(load_unified(ckpt), EngineConfig(enable_chunked_context=True, max_num_tokens=48))
    generation = Engine(load_unified(ckpt, Mapping(tp_size, 1)), generation_config)
    free = context.stats().blocks_free
    for prompt in PROMPTS:
        expected = Engine(load_unified(ckpt), EngineConfig()).generate([prompt], [SamplingParams(max_tokens=12,
                                                                                                 top_k=1)])[0]
        seq = context.add_request(prompt, SamplingParams(max_tokens=1, top_k=1), hold_kv=True)
        drain(context)
        assert seq.output_ids == expected[:1] and seq.seq_id in context.scheduler.held
        assert context.stats().blocks_free < free  # held after the request finished
        sent = context.export_kv(seq).encode()
        context.release(seq)
        assert context.stats().blocks_free == free
        line, rest = sent.split(b"\n", 1)
        header, size = decode_header(line)
        kv = decode(header, rest[:size], rest[size:])
        resumed = generation.add_request(prompt, SamplingParams(max_tokens=12, top_k=1),
                                         prefilled=(seq.output_ids, kv))
        drain(generation)
        assert resumed.output_ids == expected, prompt
    assert generation.stats().blocks_used == 0


def test_what_cannot_continue_is_refused(ckpt):
    context = Engine(load_unified(ckpt), EngineConfig())
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
    done = Engine(load_unified(ckpt), EngineConfig()).add_request(
        PROMPTS[0], SamplingParams(max_tokens=1), prefilled=(seq.output_ids, kv))
    assert done.is_finished and done.output_ids == seq.output_ids  # its first token completes it
