"""The CPU ``LLM`` runs its ``speculative_config``: NGram and DraftTarget give the output of the same LLM without
speculation, whole and streamed (several tokens in one streamed piece); other decoding types and a missing draft
directory are refused in one sentence."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from trtllm_kit.llmapi.cpu_llm import LLM, SamplingParams
from trtllm_kit.llmapi.unified import write_unified
from trtllm_kit.models.inspect import inspect_model

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
