"""Speculative decoding in the CPU runtime is lossless under greedy decoding: the output equals the output without
speculation token for token, whole and streamed, with stop words, end ids, min_tokens, logprobs, LoRA and a
JSON-schema guide, each on every built-in family, under in-flight batching with paged KV; no block leaks, prefix
reuse hits. The same on the real model: ``tests/gguf/test_smollm2_speculation.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trtllm_kit.checkpoint.convert import convert_checkpoint
from trtllm_kit.models.builtin import BUILTIN_MODELS, builtin_dir
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.executor import Executor
from trtllm_kit.runtime.lora import AdapterWeights
from trtllm_kit.runtime.lora_modules import module_shapes
from trtllm_kit.runtime.model import CheckpointModel
from trtllm_kit.runtime.prompt_lookup import PromptLookup
from trtllm_kit.runtime.sequence import SamplingParams, Sequence
from trtllm_kit.runtime.speculation import Speculator

torch.set_num_threads(1)
K = 4
CONFIGS = {  # policy, chunked context, reuse, max_num_tokens, KV pool tokens (small: drafts compete for blocks)
    "max_utilization+chunked+reuse": ("max_utilization", True, True, 24, 256),
    "no_evict+reuse": ("guaranteed_no_evict", False, True, 128, 512),
}


class Scripted:
    """Drafts the known greedy continuation with every third position wrong: accepted and rejected tokens both."""

    def __init__(self, continuations: dict[tuple[int, ...], list[int]], vocab_size: int) -> None:
        self.continuations, self.vocab_size = continuations, vocab_size
        self.forgotten: list[int] = []

    def propose(self, seqs: list[Sequence], max_draft_lens: list[int]) -> list[list[int]]:
        drafts = []
        for seq, k in zip(seqs, max_draft_lens, strict=True):
            known = self.continuations[tuple(seq.token_ids[:seq.num_prompt_tokens])]
            n = seq.num_output_tokens
            drafts.append([(t + 1) % self.vocab_size if (n + i) % 3 == 2 else t
                           for i, t in enumerate(known[n:n + k])])
        return drafts

    def forget(self, seq: Sequence) -> None:
        self.forgotten.append(seq.seq_id)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ckpt")
    for name in BUILTIN_MODELS:
        convert_checkpoint(builtin_dir(name), root / name, tp_size=1, pp_size=1, dtype="float32")
    return root


@pytest.fixture(scope="module")
def models(checkpoints: Path) -> dict[str, CheckpointModel]:
    return {name: CheckpointModel.load(checkpoints / name) for name in BUILTIN_MODELS}


def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    shared = torch.randint(0, 1000, (20,), generator=g).tolist()
    return [shared + torch.randint(0, 1000, (n,), generator=g).tolist() for n in (3, 9, 1)] + [shared[:7] * 3]


def engine(model: CheckpointModel, config: str, speculator: Speculator | None = None) -> Executor:
    policy, chunked, reuse, max_num_tokens, pool = CONFIGS[config]
    return Executor(model, EngineConfig(max_batch_size=3, max_num_tokens=max_num_tokens, tokens_per_block=8,
                                        max_tokens_in_paged_kv_cache=pool, batch_scheduler_policy=policy,
                                        enable_chunked_context=chunked, enable_kv_cache_reuse=reuse), speculator)


def run(executor: Executor, params: list[SamplingParams], lora: AdapterWeights | None = None) -> list[Sequence]:
    seqs = [executor.add_request(p, sp, lora=lora) for p, sp in zip(prompts(), params, strict=True)]
    while executor.has_work():
        executor.step()
    return seqs


def scripted(model: CheckpointModel, seqs: list[Sequence]) -> Scripted:
    return Scripted({tuple(s.token_ids[:s.num_prompt_tokens]): s.output_ids for s in seqs}, model.dims.vocab_size)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("family", list(BUILTIN_MODELS))
def test_greedy_output_equals_output_without_speculation(models, family, config):
    model, params = models[family], [SamplingParams(max_tokens=n) for n in (25, 12, 30, 20)]
    plain = engine(model, config)
    reference = run(plain, params)
    for proposer in (scripted(model, reference), PromptLookup()):
        speculator = Speculator(proposer, K)
        executor = engine(model, config, speculator)
        got = run(executor, params)
        assert [s.output_ids for s in got] == [s.output_ids for s in reference]
        assert executor.stats().blocks_used == 0
        if isinstance(proposer, Scripted):
            counts = speculator.counts
            assert 0 < counts.num_accepted_tokens < counts.num_draft_tokens
            assert executor.num_steps < plain.num_steps  # accepted drafts save steps
            assert sorted(proposer.forgotten) == sorted(s.seq_id for s in got)


@pytest.mark.parametrize("family", list(BUILTIN_MODELS))
def test_streamed_tokens_are_the_whole_output_and_come_several_per_step(models, family):
    model = models[family]
    params = [SamplingParams(max_tokens=n) for n in (25, 12, 30, 20)]
    reference = run(engine(model, "no_evict+reuse"), params)
    executor = engine(model, "no_evict+reuse", Speculator(scripted(model, reference), K))
    seqs = [executor.add_request(p, sp) for p, sp in zip(prompts(), params, strict=True)]
    streamed: dict[int, list[int]] = {s.seq_id: [] for s in seqs}
    most = 0
    while executor.has_work():
        sampled, _ = executor.step()
        for seq in sampled:
            new = seq.output_ids[len(streamed[seq.seq_id]):]
            streamed[seq.seq_id] += new
            most = max(most, len(new))
    assert [streamed[s.seq_id] for s in seqs] == [s.output_ids for s in reference]
    assert most >= 2


@pytest.mark.parametrize("family", list(BUILTIN_MODELS))
def test_stop_words_end_id_min_tokens_and_logprobs_are_kept(models, family):
    model = models[family]
    free = run(engine(model, "no_evict+reuse"), [SamplingParams(max_tokens=24) for _ in range(4)])
    outs = [s.output_ids for s in free]
    params = [SamplingParams(max_tokens=24, stop_words=[outs[0][9:11]], logprobs=2),
              SamplingParams(max_tokens=24, end_id=outs[1][6], logprobs=1),
              SamplingParams(max_tokens=24, end_id=outs[2][1], min_tokens=8, logprobs=0),
              SamplingParams(max_tokens=24, end_id=outs[3][5], keep_end_token=True, logprobs=3)]
    reference = run(engine(model, "no_evict+reuse"), params)
    got = run(engine(model, "no_evict+reuse", Speculator(scripted(model, free), K)), params)
    assert [s.finish_reason for s in reference][:2] == ["stop_words", "end_id"]
    for ref, seq in zip(reference, got, strict=True):
        assert (seq.output_ids, seq.finish_reason) == (ref.output_ids, ref.finish_reason)
        assert [(e.token_id, e.rank, e.top_ids) for e in seq.output_logprobs] == \
            [(e.token_id, e.rank, e.top_ids) for e in ref.output_logprobs]
        torch.testing.assert_close(torch.tensor([e.logprob for e in seq.output_logprobs]),
                                   torch.tensor([e.logprob for e in ref.output_logprobs]), rtol=1e-4, atol=1e-4)
        assert seq.cum_logprob == pytest.approx(ref.cum_logprob, abs=1e-3)


@pytest.mark.parametrize("family", list(BUILTIN_MODELS))
def test_lora_requests_speculate_under_their_adapter(models, checkpoints, family):
    model = models[family]
    shapes = module_shapes(json.loads((checkpoints / family / "config.json").read_text()))
    g = torch.Generator().manual_seed(5)
    pairs = {(layer, name): (torch.randn(4, n_in, generator=g) * 0.3, torch.randn(n_out, 4, generator=g) * 0.3)
             for layer in range(model.dims.num_layers) for name, (n_in, n_out) in shapes.items()}
    params = [SamplingParams(max_tokens=20) for _ in range(4)]
    base = run(engine(model, "no_evict+reuse"), params)
    reference = run(engine(model, "no_evict+reuse"), params, AdapterWeights(1, pairs))
    assert [s.output_ids for s in reference] != [s.output_ids for s in base]  # the adapter changes the output
    got = run(engine(model, "no_evict+reuse", Speculator(scripted(model, reference), K)), params,
              AdapterWeights(1, pairs))
    assert [s.output_ids for s in got] == [s.output_ids for s in reference]


def test_prefix_reuse_still_hits_and_every_block_is_freed(models):
    model = models["tiny-mistral"]
    params = [SamplingParams(max_tokens=n) for n in (25, 12, 30, 20)]
    reference = run(engine(model, "max_utilization+chunked+reuse"), params)
    executor = engine(model, "max_utilization+chunked+reuse", Speculator(scripted(model, reference), K))
    first = run(executor, params)
    reused = executor.stats().blocks_reused
    again = run(executor, params)  # the same prompts: their full blocks are found by hash
    assert [s.output_ids for s in again] == [s.output_ids for s in first] == [s.output_ids for s in reference]
    assert executor.stats().blocks_reused >= reused + sum(len(p) // 8 for p in prompts()) - 4
    assert executor.stats().blocks_used == 0


def test_counters_per_request_add_up_to_the_engine_counters(models):
    model = models["tiny-phi3"]
    params = [SamplingParams(max_tokens=n) for n in (25, 12, 30, 20)]
    reference = run(engine(model, "no_evict+reuse"), params)
    speculator = Speculator(scripted(model, reference), K)
    seqs = run(engine(model, "no_evict+reuse", speculator), params)
    total = speculator.counts
    assert sum(s.draft_counts.num_drafts for s in seqs) == total.num_drafts > 0
    assert sum(s.draft_counts.num_accepted_tokens for s in seqs) == total.num_accepted_tokens
    assert sum(total.accepted_per_position) == total.num_accepted_tokens
    assert total.accepted_per_position == sorted(total.accepted_per_position, reverse=True)
    assert total.acceptance_length == 1 + total.num_accepted_tokens / total.num_drafts


@pytest.mark.parametrize("family", list(BUILTIN_MODELS))
def test_a_json_schema_guided_request_keeps_its_output(models, tmp_path, family):
    pytest.importorskip("xgrammar")
    from trtllm_kit.model_repo.xgrammar_info import write_xgrammar_tokenizer_info
    from trtllm_kit.runtime.grammar import GrammarCompiler, Guide

    model = models[family]
    info = write_xgrammar_tokenizer_info(builtin_dir(family), tmp_path / "info.json")
    schema = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[a-z ]{1,12}$"},
                                               "ok": {"type": "boolean"}}, "required": ["name", "ok"]}
    guide = GrammarCompiler.from_tokenizer_info(info, model.dims.vocab_size).compile(
        Guide("json_schema", json.dumps(schema)))
    params = [SamplingParams(max_tokens=40, end_id=2, guide=guide) for _ in range(4)]
    reference = run(engine(model, "no_evict+reuse"), params)
    assert any(s.finish_reason == "end_id" for s in reference)
    speculator = Speculator(scripted(model, reference), K)
    got = run(engine(model, "no_evict+reuse", speculator), params)
    assert [(s.output_ids, s.finish_reason) for s in got] == [(s.output_ids, s.finish_reason) for s in reference]
    assert speculator.counts.num_accepted_tokens > 0
