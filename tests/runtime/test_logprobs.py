"""The CPU runtime's logprobs (generated tokens with their top alternatives, and prompt tokens) equal the
log-softmax of the same float32 model in ``transformers``, with and without chunked context and prefix reuse."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from trtllm_kit.checkpoint.convert import convert_checkpoint
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.executor import Executor
from trtllm_kit.runtime.model import CheckpointModel
from trtllm_kit.runtime.sequence import SamplingParams

torch.set_num_threads(1)
PROMPTS = [[1, 415, 565, 37, 902, 11, 260, 733, 5, 18, 99, 402], [1, 415, 565, 37, 902, 11, 7, 8, 9]]
TOP = 5
ATOL = 1e-4


@pytest.fixture(scope="module")
def hf_dir() -> Path:
    return builtin_dir("tiny-llama")


@pytest.fixture(scope="module")
def model(hf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> CheckpointModel:
    root = tmp_path_factory.mktemp("ckpt")
    convert_checkpoint(hf_dir, root, tp_size=1, pp_size=1, dtype="float32")
    return CheckpointModel.load(root)


@pytest.fixture(scope="module")
def hf_model(hf_dir: Path):
    return AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()


def hf_logprobs(hf_model, ids: list[int]) -> torch.Tensor:
    """[len(ids), vocab]: row i is the distribution of token i + 1."""
    with torch.no_grad():
        return torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].float(), dim=-1)


CONFIGS = {
    "whole prompt": EngineConfig(),
    "chunked context + reuse": EngineConfig(max_num_tokens=5, tokens_per_block=4, enable_chunked_context=True,
                                            enable_kv_cache_reuse=True),
}


@pytest.mark.parametrize("config", CONFIGS.values(), ids=list(CONFIGS))
def test_logprobs_equal_transformers_log_softmax(model, hf_model, config):
    engine = Executor(model, config)
    params = SamplingParams(max_tokens=6, logprobs=TOP, prompt_logprobs=TOP, temperature=0.0)
    engine.generate(PROMPTS[:1], [params])  # the second run would find the first's blocks in the cache
    seqs = [engine.add_request(p, params) for p in PROMPTS]
    for _ in range(100):
        if not engine.has_work():
            break
        engine.step()
    for seq in seqs:
        reference = hf_logprobs(hf_model, seq.token_ids)
        assert seq.prompt_logprobs[0] is None
        assert len(seq.prompt_logprobs) == seq.num_prompt_tokens
        assert len(seq.output_logprobs) == seq.num_output_tokens == 6
        scored = [*seq.prompt_logprobs[1:], *seq.output_logprobs]
        for position, entry in enumerate(scored):  # entry scores token position + 1 from row position
            assert entry is not None and entry.token_id == seq.token_ids[position + 1]
            row = reference[position]
            assert entry.logprob == pytest.approx(float(row[entry.token_id]), abs=ATOL)
            top = torch.topk(row, TOP)
            assert list(entry.top_ids) == top.indices.tolist()
            assert list(entry.top_logprobs) == pytest.approx(top.values.tolist(), abs=ATOL)
            assert entry.rank == int((row > row[entry.token_id]).sum()) + 1
        greedy = [e.rank for e in seq.output_logprobs]
        assert greedy == [1] * 6  # greedy decoding picks the most likely token
        cum = sum(float(reference[p - 1, seq.token_ids[p]]) for p in range(seq.num_prompt_tokens, len(seq)))
        assert seq.cum_logprob == pytest.approx(cum, abs=1e-3)


def test_logits_outputs_are_raw_logits(model, hf_model):
    """Context logits cover every prompt position, generation logits every generated token: raw logits, so their
    log-softmax is transformers' log-softmax, whatever temperature and penalties the sampling used."""
    engine = Executor(model, EngineConfig())
    seq = engine.add_request(PROMPTS[1], SamplingParams(max_tokens=4, temperature=0.7, top_p=0.9, seed=3,
                                                        repetition_penalty=1.4, return_context_logits=True,
                                                        return_generation_logits=True, logprobs=0))
    while engine.has_work():
        engine.step()
    reference = hf_logprobs(hf_model, seq.token_ids)
    context = torch.log_softmax(torch.stack(seq.context_logits), dim=-1)
    generation = torch.log_softmax(torch.stack(seq.generation_logits), dim=-1)
    assert context.shape == (seq.num_prompt_tokens, reference.shape[1])
    torch.testing.assert_close(context, reference[:seq.num_prompt_tokens], atol=ATOL, rtol=0)
    torch.testing.assert_close(generation, reference[seq.num_prompt_tokens - 1:-1], atol=ATOL, rtol=0)
    assert all(entry.top_ids == () for entry in seq.output_logprobs)  # logprobs=0: the sampled token only


def test_without_logprobs_nothing_is_kept(model):
    engine = Executor(model, EngineConfig())
    seq = engine.add_request(PROMPTS[0], SamplingParams(max_tokens=3))
    while engine.has_work():
        engine.step()
    assert seq.output_logprobs == [] and seq.prompt_logprobs == [None] and seq.context_logits == []
    assert seq.cum_logprob < 0


# After this prompt the float32 tiny model's greedy next token is its end of sequence (id 2).
ENDING = [1, 38, 562, 603, 287, 498, 267, 422, 346, 266, 641, 651, 285, 769, 302, 447, 333, 734]
EOS = 2


@pytest.mark.parametrize("max_tokens", [1, 4])
def test_keep_end_token_keeps_it_with_its_logprob(model, hf_model, max_tokens):
    """By default the end token is left out (TensorRT-LLM's executor); ``keep_end_token`` keeps it as the last
    output token with its raw logprob, counted in ``cum_logprob``; either way the sequence ends on ``end_id``."""
    engine = Executor(model, EngineConfig())
    common = {"max_tokens": max_tokens, "end_id": EOS, "temperature": 0.0, "logprobs": 1}
    left_out, kept = (engine.add_request(ENDING, SamplingParams(**common, keep_end_token=keep))
                      for keep in (False, True))
    while engine.has_work():
        engine.step()
    expected = float(hf_logprobs(hf_model, ENDING)[-1, EOS])
    assert left_out.output_ids == [] and left_out.output_logprobs == [] and left_out.cum_logprob == 0.0
    assert kept.output_ids == [EOS] and kept.finish_reason == left_out.finish_reason == "end_id"
    [entry] = kept.output_logprobs
    assert entry.token_id == EOS and entry.rank == 1 and entry.top_ids == (EOS,)
    assert entry.logprob == pytest.approx(expected, abs=ATOL)
    assert kept.cum_logprob == pytest.approx(expected, abs=ATOL)
