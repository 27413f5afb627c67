"""A request of n sequences computes its prompt once: its forks share the prompt's full blocks (one reference
each) and copy the partial one; greedy forks agree, seeded sampling repeats itself, and every fork's numbers equal
a full recompute of its own tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trtllm_kit.checkpoint.convert import convert_checkpoint
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.executor import Executor
from trtllm_kit.runtime.model import CheckpointModel
from trtllm_kit.runtime.sequence import SamplingParams, Sequence, returned_sequences

torch.set_num_threads(1)
PROMPT = list(range(3, 21))  # 18 tokens: four full blocks of 4 and a partial one
TPB = 4


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> CheckpointModel:
    root = tmp_path_factory.mktemp("ckpt")
    convert_checkpoint(builtin_dir("tiny-llama"), root, tp_size=1, pp_size=1, dtype="float32")
    return CheckpointModel.load(Path(root))


def engine_for(model: CheckpointModel, policy: str = "guaranteed_no_evict") -> Executor:
    return Executor(model, EngineConfig(tokens_per_block=TPB, max_tokens_in_paged_kv_cache=512,
                                      batch_scheduler_policy=policy))


def run(engine: Executor, first: Sequence) -> list[int]:
    """Steps until done; returns the context tokens computed per step."""
    context = []
    for _ in range(200):
        if not engine.has_work():
            break
        engine.step()
        context.append(engine.last_context_tokens)
    assert all(seq.is_finished for seq in first.group)
    return context


@pytest.mark.parametrize("policy", ["guaranteed_no_evict", "max_utilization"])
def test_one_prefill_shared_blocks_and_identical_greedy_outputs(model, policy):
    engine = engine_for(model, policy)
    first = engine.add_request(PROMPT, SamplingParams(max_tokens=8, temperature=0.0, n=3))
    assert [seq.index for seq in first.group] == [0, 1, 2]
    engine.step()  # the prefill; the forks start on its blocks
    manager = engine.scheduler.block_manager
    assert engine.last_context_tokens == len(PROMPT)
    tables = [seq.block_table for seq in first.group]
    shared = len(PROMPT) // TPB
    assert tables[0][:shared] == tables[1][:shared] == tables[2][:shared]
    assert all(manager.blocks[b].ref_count == 3 for b in tables[0][:shared])
    partial = {table[shared] for table in tables}
    assert len(partial) == 3 and all(manager.blocks[b].ref_count == 1 for b in partial)
    assert [seq.num_output_tokens for seq in first.group] == [1, 1, 1]
    context = run(engine, first)
    assert sum(context) == 0  # no other prompt computation: the forks never computed theirs
    outputs = [seq.output_ids for seq in first.group]
    assert outputs[0] == outputs[1] == outputs[2] == engine_for(model).generate(
        [PROMPT], [SamplingParams(max_tokens=8, temperature=0.0)])[0]
    assert manager.num_free_blocks == manager.num_blocks
    assert all(block.ref_count == 0 for block in manager.blocks)


def test_seeded_sampling_repeats_and_forks_compute_their_own_tokens_right(model):
    params = SamplingParams(max_tokens=10, temperature=1.0, top_p=1.0, seed=11, n=3, logprobs=0)
    runs = []
    for _ in range(2):
        engine = engine_for(model)
        first = engine.add_request(PROMPT[:16], params)  # a prompt of whole blocks: nothing to copy
        run(engine, first)
        runs.append([seq.output_ids for seq in first.group])
    assert runs[0] == runs[1]
    assert len({tuple(out) for out in runs[0]}) > 1  # each fork draws its own numbers
    for seq in first.group:  # the shared blocks hold the right K/V: a full recompute gives the same logprobs
        with torch.no_grad():
            reference = torch.log_softmax(model.forward(torch.tensor([seq.token_ids]))[0].float(), dim=-1)
        expected = [float(reference[p - 1, seq.token_ids[p]]) for p in range(seq.num_prompt_tokens, len(seq))]
        assert [e.logprob for e in seq.output_logprobs] == pytest.approx(expected, abs=1e-4)


def test_partial_block_is_copied_for_each_fork(model):
    engine = engine_for(model)
    first = engine.add_request(PROMPT, SamplingParams(max_tokens=6, temperature=0.9, top_p=1.0, seed=5, n=2,
                                                      logprobs=0))
    run(engine, first)
    for seq in first.group:
        with torch.no_grad():
            reference = torch.log_softmax(model.forward(torch.tensor([seq.token_ids]))[0].float(), dim=-1)
        expected = [float(reference[p - 1, seq.token_ids[p]]) for p in range(seq.num_prompt_tokens, len(seq))]
        assert [e.logprob for e in seq.output_logprobs] == pytest.approx(expected, abs=1e-4)


def test_best_of_returns_the_n_most_likely(model):
    engine = engine_for(model)
    first = engine.add_request(PROMPT, SamplingParams(max_tokens=6, temperature=1.0, top_p=1.0, seed=2, n=2,
                                                      best_of=4))
    run(engine, first)
    assert len(first.group) == 4
    best = returned_sequences(first)
    ranked = sorted((seq.cum_logprob for seq in first.group), reverse=True)
    assert [seq.cum_logprob for seq in best] == ranked[:2]


def test_cancelling_before_the_prefill_cancels_the_whole_group(model):
    engine = engine_for(model)
    engine.add_request(PROMPT, SamplingParams(max_tokens=4, temperature=0.0))
    engine.step()
    first = engine.add_request(PROMPT, SamplingParams(max_tokens=4, temperature=0.0, n=3))
    engine.cancel(first)
    assert [seq.finish_reason for seq in first.group] == ["cancelled"] * 3
    for _ in range(50):
        if not engine.has_work():
            break
        engine.step()
    assert not engine.has_work()


def test_forks_without_room_wait_and_compute_their_prompt_themselves(model):
    """A batch of one: the forks cannot start beside the first sequence, so they queue and run after it."""
    engine = Executor(model, EngineConfig(max_batch_size=1, tokens_per_block=TPB, max_tokens_in_paged_kv_cache=512))
    first = engine.add_request(PROMPT, SamplingParams(max_tokens=5, temperature=0.0, n=2))
    run(engine, first)
    assert first.group[0].output_ids == first.group[1].output_ids


@pytest.mark.parametrize(("policy", "pool_tokens", "tokens_per_block"), [
    ("max_utilization", 96, 4), ("guaranteed_no_evict", 160, 8), ("max_utilization", 64, 8)])
def test_groups_under_pressure_finish_without_leaks_and_equal_single_requests(model, policy, pool_tokens,
                                                                            tokens_per_block):
    """A small pool: forks queue or are preempted and recomputed; greedy forks still equal a lone request."""
    engine = Executor(model, EngineConfig(max_batch_size=4, tokens_per_block=tokens_per_block,
                                        max_tokens_in_paged_kv_cache=pool_tokens, batch_scheduler_policy=policy))
    prompts = [PROMPT[:n] for n in (18, 9, 13)]
    firsts = [engine.add_request(p, SamplingParams(max_tokens=12, temperature=0.0, n=n))
              for p, n in zip(prompts, (3, 2, 1), strict=True)]
    for _ in range(500):
        if not engine.has_work():
            break
        engine.step()
    manager = engine.scheduler.block_manager
    assert not engine.has_work()
    assert all(block.ref_count == 0 for block in manager.blocks) and manager.num_free_blocks == manager.num_blocks
    alone = engine_for(model).generate(prompts, [SamplingParams(max_tokens=12, temperature=0.0)] * 3)
    for first, expected in zip(firsts, alone, strict=True):
        assert [seq.output_ids for seq in first.group] == [expected] * len(first.group)


def test_a_group_larger_than_the_pool_still_runs(model):
    """The pool holds two full reservations; the other two forks of four queue and run after them."""
    engine = Executor(model, EngineConfig(tokens_per_block=TPB, max_tokens_in_paged_kv_cache=64))
    first = engine.add_request(PROMPT, SamplingParams(max_tokens=12, temperature=0.0, n=4))  # 30 tokens each
    run(engine, first)
    assert len({tuple(seq.output_ids) for seq in first.group}) == 1
