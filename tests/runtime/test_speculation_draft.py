"""Draft-target speculation in the CPU runtime: a second model with its own paged KV pool drafts K greedy tokens;
the output equals the output without speculation token for token on every built-in family, with the model itself
as its draft (everything accepted) and with another family's model sharing the tokenizer (mostly rejected); both
pools end with every block free."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trtllm_kit.checkpoint.convert import convert_checkpoint
from trtllm_kit.models.builtin import BUILTIN_MODELS, builtin_dir
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.draft_model import DraftModel, draft_config
from trtllm_kit.runtime.executor import Executor
from trtllm_kit.runtime.model import CheckpointModel
from trtllm_kit.runtime.sequence import SamplingParams
from trtllm_kit.runtime.speculation import Speculator

torch.set_num_threads(1)
K = 3
CONFIG = EngineConfig(max_batch_size=3, max_num_tokens=32, tokens_per_block=8, max_tokens_in_paged_kv_cache=256,
                      batch_scheduler_policy="max_utilization", enable_chunked_context=True)
OTHER = {"tiny-llama": "tiny-mistral", "tiny-mistral": "tiny-llama", "tiny-qwen2": "tiny-llama",
         "tiny-phi3": "tiny-qwen2"}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, CheckpointModel]:
    root = tmp_path_factory.mktemp("ckpt")
    for name in BUILTIN_MODELS:
        convert_checkpoint(builtin_dir(name), root / name, tp_size=1, pp_size=1, dtype="float32")
    return {name: CheckpointModel.load(Path(root / name)) for name in BUILTIN_MODELS}


def generate(executor: Executor, max_tokens: list[int]) -> list[list[int]]:
    g = torch.Generator().manual_seed(9)
    prompts = [torch.randint(0, 1000, (n,), generator=g).tolist() for n in (6, 19, 11, 30)]
    return executor.generate(prompts, [SamplingParams(max_tokens=n) for n in max_tokens])


@pytest.mark.parametrize("family", list(BUILTIN_MODELS))
def test_draft_target_output_equals_output_without_speculation(models, family):
    model, max_tokens = models[family], [20, 9, 25, 14]
    reference = generate(Executor(model, CONFIG), max_tokens)
    for draft_name in (family, OTHER[family]):
        draft = DraftModel(models[draft_name], draft_config(CONFIG, K), model.dims.vocab_size)
        speculator = Speculator(draft, K)
        executor = Executor(model, CONFIG, speculator)
        assert generate(executor, max_tokens) == reference
        counts = speculator.counts
        assert counts.num_drafts > 0
        if draft_name == family:  # the model drafting for itself: every draft token is its own greedy choice
            assert counts.num_accepted_tokens == counts.num_draft_tokens
        else:
            assert counts.num_accepted_tokens < counts.num_draft_tokens
        assert executor.stats().blocks_used == 0 and draft.engine.stats().blocks_used == 0
        assert not draft.draft_of
