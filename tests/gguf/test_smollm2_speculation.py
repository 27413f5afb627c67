"""Speculation on the real model (SmolLM2-135M-Instruct, float32): a short greedy run of a copy-heavy request gives
the output without speculation token for token with prompt lookup (drafts accepted) and with draft-target (the
model's first layers as its draft)."""

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
from trtllm_kit.runtime.model import CheckpointModel
from trtllm_kit.runtime.prompt_lookup import PromptLookup
from trtllm_kit.runtime.sequence import SamplingParams
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
