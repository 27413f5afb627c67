"""Priority scheduling in the CPU runtime: the waiting queue is ordered by priority, a high-priority request that
cannot start preempts the lowest-priority running one, and preempted sequences still return exactly the tokens
of a naive full-recompute run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trtllm_kit.checkpoint.convert import convert_checkpoint
from trtllm_kit.errors import KitUsageError
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.executor import Executor
from trtllm_kit.runtime.model import CheckpointModel
from trtllm_kit.runtime.sequence import SamplingParams

torch.set_num_threads(1)
VOCAB = 1031


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> CheckpointModel:
    root = tmp_path_factory.mktemp("ckpt")
    convert_checkpoint(builtin_dir("tiny-llama"), root / "llama", tp_size=1, pp_size=1, dtype="float32")
    return CheckpointModel.load(Path(root / "llama"))


def naive(model: CheckpointModel, prompt: list[int], max_tokens: int) -> list[int]:
    """Greedy decoding that recomputes the whole sequence for every token: no cache, no scheduler."""
    ids = list(prompt)
    for _ in range(max_tokens):
        ids.append(int(model.forward(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt):]


def prompts(count: int, length: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (length,), generator=g).tolist() for _ in range(count)]


@pytest.mark.parametrize("policy", ["max_utilization", "guaranteed_no_evict"])
def test_high_priority_preempts_low_and_every_output_equals_a_naive_run(model, policy):
    # 2 batch slots and 10 blocks of 8 tokens: two low requests (12 + 24 tokens: 5 blocks reserved each) fill it
    engine = Executor(model, EngineConfig(max_batch_size=2, max_num_tokens=64, tokens_per_block=8,
                                        max_tokens_in_paged_kv_cache=80, batch_scheduler_policy=policy,
                                        enable_kv_cache_reuse=False))
    low_prompts, high_prompts = prompts(2, 12, 1), prompts(2, 10, 2)
    lows = [engine.add_request(p, SamplingParams(max_tokens=24, top_k=1, priority=0.2)) for p in low_prompts]
    for _ in range(6):  # the lows run a few steps
        engine.step()
    assert all(s.num_output_tokens == 6 for s in lows)
    highs = [engine.add_request(p, SamplingParams(max_tokens=8, top_k=1, priority=0.9)) for p in high_prompts]
    finished_order = []
    for _ in range(200):
        if not engine.has_work():
            break
        finished_order += [s.seq_id for s in engine.step()[1]]
    assert not engine.has_work()
    assert sum(s.num_preemptions for s in lows) >= 1 and all(s.num_preemptions == 0 for s in highs)
    assert set(finished_order[:2]) == {s.seq_id for s in highs}  # the high class finished first
    for seq, prompt in zip([*lows, *highs], [*low_prompts, *high_prompts], strict=True):
        assert seq.output_ids == naive(model, prompt, seq.params.max_tokens)
    assert engine.stats().blocks_used == 0


def test_waiting_queue_is_ordered_by_priority_then_arrival(model):
    engine = Executor(model, EngineConfig(max_batch_size=1, max_num_tokens=64, tokens_per_block=8,
                                        max_tokens_in_paged_kv_cache=160))
    order = [0.5, 0.1, 0.9, 0.5, 0.9]
    seqs = [engine.add_request(p, SamplingParams(max_tokens=2, top_k=1, priority=q))
            for p, q in zip(prompts(5, 4, 3), order, strict=True)]
    assert [s.seq_id for s in engine.scheduler.waiting] == [seqs[i].seq_id for i in (2, 4, 0, 3, 1)]


def test_equal_priorities_never_preempt_under_guaranteed_no_evict(model):
    engine = Executor(model, EngineConfig(max_batch_size=2, max_num_tokens=64, tokens_per_block=8,
                                        max_tokens_in_paged_kv_cache=80, enable_kv_cache_reuse=False))
    engine.generate(prompts(4, 12, 4), [SamplingParams(max_tokens=24, top_k=1)] * 4)
    assert engine.stats().preemptions == 0


def test_priority_outside_zero_one_is_refused():
    with pytest.raises(KitUsageError, match=r"^priority must be a number in \[0, 1\], got 1.5; send one that is, "
                                         r"or leave priority out\.$"):
        SamplingParams(priority=1.5)
