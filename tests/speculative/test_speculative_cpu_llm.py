"""The CPU ``LLM`` runs its ``speculative_config``: NGram and DraftTarget give the output of the same LLM without
speculation, whole and streamed (several tokens in one streamed piece); other decoding types and a missing draft
directory are refused in one sentence. Each completion carries its speculation counts, which the llmapi model sends
as the ``tensorrt_llm`` model's count tensors, read back into the OpenAI ``usage.speculative``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from trtllm_kit.llmapi.cpu_llm import LLM, SamplingParams
from trtllm_kit.llmapi.unified import write_unified
from trtllm_kit.models.inspect import inspect_model
from trtllm_kit.serve.openai.responses import speculative_usage
from trtllm_kit.triton_models.llmapi_outputs import completion_responses
from trtllm_kit.wire import DraftAcceptance, GenerationRequest
from trtllm_kit.wire.llmapi_response import decode_llmapi_response, encode_llmapi_response

torch.set_num_threads(1)
PROMPT = [1, 415, 565, 37, 902, 11, 415, 565, 37, 902, 11, 415]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ckpt")
    write_unified(inspect_model("builtin:tiny-llama"), out, "float32")
    return out


def generate(ckpt: Path, speculative_config: dict[str, Any] | None) -> tuple[list[int], list[list[int]]]:
    llm = LLM(model=str(ckpt), max_seq_len=256, speculative_config=speculative_config)

    async def go() -> tuple[list[int], list[list[int]]]:
        params = SamplingParams(max_tokens=40, temperature=0.0)
        whole = await llm.generate_async(PROMPT, params).aresult()
        pieces = [list(output.outputs[0].token_ids_diff)
                  async for output in llm.generate_async(PROMPT, params, streaming=True)]
        return list(whole.outputs[0].token_ids), pieces
    try:
        return asyncio.run(asyncio.wait_for(go(), 120))
    finally:
        llm.shutdown()


def test_ngram_and_draft_target_equal_the_llm_without_speculation(ckpt):
    reference, _ = generate(ckpt, None)
    for config in ({"decoding_type": "NGram", "max_draft_len": 4},
                   {"decoding_type": "DraftTarget", "max_draft_len": 3, "speculative_model_dir": str(ckpt)}):
        whole, pieces = generate(ckpt, config)
        assert whole == reference and [t for p in pieces for t in p] == reference
        if config["decoding_type"] == "DraftTarget":  # the model drafting for itself: all accepted
            assert max(len(p) for p in pieces) == 4


@pytest.mark.parametrize(("config", "message"), [
    ({"decoding_type": "Eagle", "max_draft_len": 3},
     r"^speculative_config decoding_type 'Eagle' does not run on the CPU runtime; use one of NGram, DraftTarget$"),
    ({"decoding_type": "DraftTarget", "speculative_model_dir": "/nonexistent"},
     r"^speculative_config speculative_model_dir is '/nonexistent', not a directory; point it at the draft "
     r"checkpoint$"),
])
def test_what_the_cpu_runtime_cannot_run_is_refused(ckpt, config, message):
    with pytest.raises(ValueError, match=message):
        LLM(model=str(ckpt), speculative_config=config)


def counted(ckpt: Path, speculative_config: dict[str, Any] | None) -> tuple[Any, list[Any]]:
    """The whole answer's completion and each streamed step's, with their counts."""
    llm = LLM(model=str(ckpt), max_seq_len=256, speculative_config=speculative_config)

    async def go() -> tuple[Any, list[Any]]:
        params = SamplingParams(max_tokens=40, temperature=0.0)
        whole = (await llm.generate_async(PROMPT, params).aresult()).outputs[0]
        steps = [(output.outputs[0].draft_acceptance, list(output.outputs[0].token_ids_diff))
                 async for output in llm.generate_async(PROMPT, params, streaming=True)]
        return whole, steps
    try:
        return asyncio.run(asyncio.wait_for(go(), 120))
    finally:
        llm.shutdown()


def test_each_completion_carries_its_counts_to_the_openai_usage(ckpt):
    # the model drafting for itself: every draft token is kept
    config = {"decoding_type": "DraftTarget", "max_draft_len": 3, "speculative_model_dir": str(ckpt)}
    whole, steps = counted(ckpt, config)
    acceptance = whole.draft_acceptance
    assert isinstance(acceptance, DraftAcceptance) and acceptance.num_drafts > 0
    assert acceptance.num_accepted_tokens == acceptance.num_draft_tokens <= 3 * acceptance.num_drafts
    # the prompt's step emits one token, each verifying step its accepted tokens and one more
    assert len(whole.token_ids) == 1 + acceptance.num_drafts + acceptance.num_accepted_tokens
    assert steps[-1][0] == acceptance  # greedy: the streamed request drafted the same
    running = [a.num_drafts for a, _ in steps if a is not None]
    assert running == sorted(running) and len(running) > 1  # cumulative, step by step

    req = GenerationRequest(tuple(PROMPT), 40)
    [response] = completion_responses(req, SimpleNamespace(prompt_token_ids=PROMPT, outputs=[whole]), diff=False,
                                      reported=set())
    sent = decode_llmapi_response(encode_llmapi_response(response))
    assert sent.draft_acceptance == acceptance
    assert speculative_usage([sent.draft_acceptance]) == {
        "drafts": acceptance.num_drafts, "draft_tokens": acceptance.num_draft_tokens,
        "accepted_tokens": acceptance.num_accepted_tokens,
        "acceptance_length": round(1 + acceptance.num_accepted_tokens / acceptance.num_drafts, 4)}


def test_without_speculation_a_completion_has_no_counts(ckpt):
    whole, steps = counted(ckpt, None)
    assert whole.draft_acceptance is None and all(a is None for a, _ in steps)
    [response] = completion_responses(GenerationRequest(tuple(PROMPT), 40),
                                      SimpleNamespace(prompt_token_ids=PROMPT, outputs=[whole]), diff=False,
                                      reported=set())
    assert "total_drafts" not in encode_llmapi_response(response)
