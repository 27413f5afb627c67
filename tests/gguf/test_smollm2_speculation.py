"""Speculation on the real model (SmolLM2-135M-Instruct, float32): a short greedy run of a copy-heavy request gives
the output without speculation token for token with prompt lookup (drafts accepted) and with draft-target (the
model's first layers as its draft); with prompt lookup, streamed as whole, with stop words, end ids, min_tokens and
logprobs, under a LoRA adapter and under a JSON-schema guide."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer

from trtllm_kit.llmapi.load import load_unified
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.draft_model import DraftModel, draft_config
from trtllm_kit.runtime.executor import Executor
from trtllm_kit.runtime.lora import AdapterWeights
from trtllm_kit.runtime.lora_modules import module_shapes
from trtllm_kit.runtime.model import CheckpointModel
from trtllm_kit.runtime.prompt_lookup import PromptLookup
from trtllm_kit.runtime.sequence import SamplingParams, Sequence
from trtllm_kit.runtime.speculation import Speculator

pytestmark = pytest.mark.slow

torch.set_num_threads(1)
CODE = "def area(width, height):\n    total = width * height\n    return total\n"
REQUEST = f"Rewrite this code, renaming `total` to `result`:\n\n{CODE}"
CONFIG = EngineConfig(max_batch_size=2, max_num_tokens=512, tokens_per_block=16, max_tokens_in_paged_kv_cache=1024)
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def model(smollm2_dir: Path) -> CheckpointModel:
    return load_unified(smollm2_dir)


@pytest.fixture(scope="module")
def prompt(smollm2_dir: Path) -> list[int]:
    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_dir))
    text = tokenizer.apply_chat_template([{"role": "user", "content": REQUEST}], add_generation_prompt=True,
                                         tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def greedy(model: CheckpointModel, prompt: list[int], speculator: Speculator | None) -> list[int]:
    return Executor(model, CONFIG, speculator).generate([prompt], [SamplingParams(max_tokens=MAX_TOKENS)])[0]


@pytest.fixture(scope="module")
def reference(model: CheckpointModel, prompt: list[int]) -> list[int]:
    """The greedy output without speculation, which both speculators must give."""
    return greedy(model, prompt, None)


def test_prompt_lookup_keeps_the_greedy_output(model, prompt, reference):
    speculator = Speculator(PromptLookup(), 4)
    assert greedy(model, prompt, speculator) == reference
    assert speculator.counts.num_accepted_tokens > 0


def test_draft_target_with_the_first_layers_as_draft_keeps_the_greedy_output(model, prompt, reference, smollm2_dir,
                                                                            tmp_path):
    config = json.loads((smollm2_dir / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 4}))
    save_file({k: v for k, v in load_file(str(smollm2_dir / "model.safetensors")).items()
               if not k.startswith("model.layers.") or int(k.split(".")[2]) < 4}, str(tmp_path / "model.safetensors"))
    draft = DraftModel(load_unified(tmp_path), draft_config(CONFIG, 3), model.dims.vocab_size)
    speculator = Speculator(draft, 3)
    assert greedy(model, prompt, speculator) == reference
    assert speculator.counts.num_drafts > 0


def run(model: CheckpointModel, prompt: list[int], params: list[SamplingParams], speculator: Speculator | None,
        lora: AdapterWeights | None = None) -> tuple[list[Sequence], list[list[int]]]:
    """The finished sequences of ``prompt`` under each of ``params`` in one batch, and each one's tokens as streamed
    step by step."""
    executor = Executor(model, CONFIG, speculator)
    seqs = [executor.add_request(prompt, p, lora=lora) for p in params]
    streamed: dict[int, list[int]] = {s.seq_id: [] for s in seqs}
    while executor.has_work():
        sampled, _ = executor.step()
        for seq in sampled:
            streamed[seq.seq_id] += seq.output_ids[len(streamed[seq.seq_id]):]
    assert executor.stats().blocks_used == 0
    return seqs, [streamed[s.seq_id] for s in seqs]


def test_streamed_tokens_are_the_greedy_output_several_per_step(model, prompt, reference):
    speculator = Speculator(PromptLookup(), 4)
    executor = Executor(model, CONFIG, speculator)
    seq = executor.add_request(prompt, SamplingParams(max_tokens=MAX_TOKENS))
    pieces: list[list[int]] = []
    while executor.has_work():
        sampled, _ = executor.step()
        if seq in sampled:
            pieces.append(seq.output_ids[sum(len(p) for p in pieces):])
    assert [t for p in pieces for t in p] == reference
    assert max(len(p) for p in pieces) >= 2  # accepted drafts arrive with the step that verified them


def test_stop_words_end_id_min_tokens_and_logprobs_are_kept(model, prompt, reference):
    params = [SamplingParams(max_tokens=MAX_TOKENS, stop_words=[reference[12:14]], logprobs=2),
              SamplingParams(max_tokens=MAX_TOKENS, end_id=reference[6], logprobs=1),
              SamplingParams(max_tokens=MAX_TOKENS, end_id=reference[1], min_tokens=8, logprobs=0)]
    plain, _ = run(model, prompt, params, None)
    speculator = Speculator(PromptLookup(), 4)
    got, streamed = run(model, prompt, params, speculator)
    assert [s.finish_reason for s in plain][:2] == ["stop_words", "end_id"]
    assert speculator.counts.num_accepted_tokens > 0
    for ref, seq, pieces in zip(plain, got, streamed, strict=True):
        assert (seq.output_ids, seq.finish_reason) == (ref.output_ids, ref.finish_reason)
        assert pieces == ref.output_ids
        assert [(e.token_id, e.rank, e.top_ids) for e in seq.output_logprobs] == \
            [(e.token_id, e.rank, e.top_ids) for e in ref.output_logprobs]
        torch.testing.assert_close(torch.tensor([e.logprob for e in seq.output_logprobs]),
                                   torch.tensor([e.logprob for e in ref.output_logprobs]), rtol=1e-4, atol=1e-4)


def test_a_lora_request_speculates_under_its_adapter(model, prompt, reference, smollm2_dir):
    shapes = module_shapes(json.loads((smollm2_dir / "config.json").read_text()))
    g = torch.Generator().manual_seed(5)
    pairs = {(layer, name): (torch.randn(4, n_in, generator=g) * 0.2, torch.randn(n_out, 4, generator=g) * 0.2)
             for layer in range(model.dims.num_layers) for name, (n_in, n_out) in shapes.items()}
    params = [SamplingParams(max_tokens=MAX_TOKENS)]
    [plain], _ = run(model, prompt, params, None, AdapterWeights(1, pairs))
    assert plain.output_ids != reference  # the adapter changes the output
    speculator = Speculator(PromptLookup(), 4)
    [got], [pieces] = run(model, prompt, params, speculator, AdapterWeights(1, pairs))
    assert got.output_ids == pieces == plain.output_ids
    assert speculator.counts.num_accepted_tokens > 0


def test_a_json_schema_guided_request_keeps_its_output(model, smollm2_dir, tmp_path):
    pytest.importorskip("xgrammar")
    from trtllm_kit.model_repo.xgrammar_info import write_xgrammar_tokenizer_info
    from trtllm_kit.runtime.grammar import GrammarCompiler, Guide

    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_dir))
    record = '{"name": "area", "ok": true}'
    text = tokenizer.apply_chat_template([{"role": "user", "content": f"Repeat this JSON exactly: {record}"}],
                                         add_generation_prompt=True, tokenize=False)
    copy_prompt = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    info = write_xgrammar_tokenizer_info(smollm2_dir, tmp_path / "info.json")
    schema = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[a-z ]{1,12}$"},
                                               "ok": {"type": "boolean"}}, "required": ["name", "ok"]}
    guide = GrammarCompiler.from_tokenizer_info(info, model.dims.vocab_size).compile(
        Guide("json_schema", json.dumps(schema)))
    params = [SamplingParams(max_tokens=32, end_id=tokenizer.eos_token_id, guide=guide)]
    [plain], _ = run(model, copy_prompt, params, None)
    assert plain.finish_reason == "end_id" and json.loads(tokenizer.decode(plain.output_ids))["ok"] in (True, False)
    speculator = Speculator(PromptLookup(), 4)
    [got], [pieces] = run(model, copy_prompt, params, speculator)
    assert (got.output_ids, got.finish_reason) == (plain.output_ids, plain.finish_reason) and pieces == got.output_ids
    assert speculator.counts.num_accepted_tokens > 0
