"""``build --target cpu --speculative ngram``: the ``tensorrt_llm`` model's parameters name prompt lookup and its
draft length, and the CPU model's speculator made from them drafts a request's own tokens first, else by prompt
lookup, keeping the greedy output; parameters it cannot run are refused in one sentence."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trtllm_kit.checkpoint.convert import convert_checkpoint
from trtllm_kit.cli import run
from trtllm_kit.errors import KitUsageError
from trtllm_kit.model_repo.configs import parse_config
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.executor import Executor
from trtllm_kit.runtime.model import CheckpointModel
from trtllm_kit.runtime.sequence import SamplingParams
from trtllm_kit.triton_models.cpu_speculation import cpu_speculator

torch.set_num_threads(1)
CONFIG = EngineConfig(max_batch_size=2, max_num_tokens=64, tokens_per_block=8, max_tokens_in_paged_kv_cache=256)


def test_the_cpu_build_names_prompt_lookup_in_the_models_parameters(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run(["build", "builtin:tiny-llama", "--target", "cpu", "--dtype", "float32", "--no-verify",
                "--speculative", "ngram", "--max-draft-len", "3", "--out", str(out)]) == 0
    config = parse_config((out / "repo" / "tensorrt_llm" / "config.pbtxt").read_text())
    values = {k: v.string_value for k, v in config.parameters.items()}
    assert (values["speculative_decoding_mode"], values["max_draft_len"]) == ("ngram", "3")
    speculator = cpu_speculator(values, CONFIG)
    prompt = [5, 6, 7, 8] * 4
    assert speculator.proposer.propose([Executor(CheckpointModel.load(out / "checkpoint"), CONFIG)
                                        .add_request(prompt, SamplingParams())], [8]) == [[5, 6, 7]]


def test_the_speculator_keeps_the_greedy_output_and_prefers_the_requests_drafts(tmp_path: Path) -> None:
    convert_checkpoint(builtin_dir("tiny-llama"), tmp_path / "ckpt", tp_size=1, pp_size=1, dtype="float32")
    model = CheckpointModel.load(tmp_path / "ckpt")
    prompts = [[5, 6, 7, 8] * 4, [9, 10, 11] * 5]
    params = [SamplingParams(max_tokens=20) for _ in prompts]
    reference = Executor(model, CONFIG).generate(prompts, params)
    values = {"speculative_decoding_mode": "ngram", "max_draft_len": "4"}
    speculator = cpu_speculator(values, CONFIG)
    assert Executor(model, CONFIG, speculator).generate(prompts, params) == reference
    assert speculator.counts.num_drafts > 0
    engine = Executor(model, CONFIG, cpu_speculator(values, CONFIG))
    seq = engine.add_request(prompts[0], SamplingParams(max_tokens=20, draft_ids=tuple(reference[0][:10])))
    seq.token_ids.append(reference[0][0])  # as after its prompt step
    assert engine.speculator is not None
    assert engine.speculator.proposer.propose([seq], [16]) == [reference[0][1:10]]


@pytest.mark.parametrize(("values", "message"), [
    ({"speculative_decoding_mode": "lookahead", "max_draft_len": "4"},
     "parameter speculative_decoding_mode is 'lookahead'; the CPU runtime's model runs ngram or draft-target, or "
     "leave it empty."),
    ({"speculative_decoding_mode": "ngram", "max_draft_len": "0"},
     "parameter max_draft_len is '0'; set a whole number of draft tokens, at least 1."),
    ({"speculative_decoding_mode": "draft-target", "max_draft_len": "3", "draft_model_path": "/nonexistent/draft"},
     "parameter draft_model_path is '/nonexistent/draft', which holds no draft checkpoint (config.json); point it "
     "at the draft's checkpoint, or rebuild with --speculative draft-target --draft-model DIR."),
    ({"speculative_decoding_mode": "draft-target", "max_draft_len": "3"},
     "parameter draft_model_path is '', which holds no draft checkpoint (config.json); point it at the draft's "
     "checkpoint, or rebuild with --speculative draft-target --draft-model DIR."),
])
def test_parameters_the_model_cannot_run_are_refused(values: dict[str, str], message: str) -> None:
    with pytest.raises(KitUsageError) as error:
        cpu_speculator(values, CONFIG)
    assert str(error.value) == message


def test_without_the_parameter_only_the_requests_drafts_are_verified() -> None:
    speculator = cpu_speculator({"speculative_decoding_mode": "${speculative_decoding_mode}"}, CONFIG)
    assert type(speculator.proposer).__name__ == "ExternalDrafts"
    assert speculator.max_draft_len == CONFIG.max_num_tokens


def test_draft_target_drafts_k_tokens_from_the_draft_checkpoint_and_keeps_the_greedy_output(tmp_path: Path) -> None:
    convert_checkpoint(builtin_dir("tiny-llama"), tmp_path / "ckpt", tp_size=1, pp_size=1, dtype="float32")
    convert_checkpoint(builtin_dir("tiny-qwen2"), tmp_path / "draft", tp_size=1, pp_size=1, dtype="float32")
    model = CheckpointModel.load(tmp_path / "ckpt")
    prompts = [[5, 6, 7, 8] * 4, [9, 10, 11] * 5]
    params = [SamplingParams(max_tokens=20) for _ in prompts]
    reference = Executor(model, CONFIG).generate(prompts, params)
    values = {"speculative_decoding_mode": "draft-target", "max_draft_len": "3", "draft_model_path": "draft"}
    speculator = cpu_speculator(values, CONFIG, tmp_path, model.dims.vocab_size)  # relative to the repository
    assert Executor(model, CONFIG, speculator).generate(prompts, params) == reference
    counts = speculator.counts
    assert counts.num_drafts > 0 and counts.num_draft_tokens <= 3 * counts.num_drafts  # K at most (of 64 allowed)
    assert 0 <= counts.num_accepted_tokens <= counts.num_draft_tokens
