"""Block accounting of the scheduler and block manager under random workloads (no model: tokens are drawn)."""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.scheduler import Scheduler
from trtllm_kit.runtime.sequence import SamplingParams, Sequence

PREFIX = list(range(100, 164))


def check_invariants(scheduler: Scheduler) -> None:
    manager = scheduler.block_manager
    held = Counter(b for seq in scheduler.running + scheduler.padding for b in seq.block_table)
    assert not any(seq.block_table for seq in scheduler.waiting)
    for block in manager.blocks:
        assert block.ref_count == held[block.block_id]
        assert (block.block_id in manager.free_block_ids) == (block.ref_count == 0)
    for seq in scheduler.running:
        assert len(seq.block_table) * manager.tokens_per_block >= seq.num_computed_tokens + seq.num_scheduled_tokens
    for block_hash, block_id in manager.hash_to_block_id.items():
        assert manager.blocks[block_id].hash == block_hash


def drive(scheduler: Scheduler, seqs: list[Sequence], cancel_at: dict[int, int], seed: int) -> list[int]:
    """Run to completion with drawn tokens and cancellations at given steps; returns the batch size per step."""
    rng, sizes, step = random.Random(seed), [], 0
    pending = list(seqs)
    while pending or not scheduler.is_finished():
        while pending and rng.random() < 0.5:
            scheduler.add(pending.pop(0))
        for seq in seqs:
            if cancel_at.get(seq.seq_id) == step and not seq.is_finished and seq not in pending:
                scheduler.finish(seq, "cancelled")
        scheduled = scheduler.schedule()
        check_invariants(scheduler)
        tokens = [rng.randrange(1000) if s.num_computed_tokens + s.num_scheduled_tokens == len(s) else None
                  for s in scheduled]
        scheduler.postprocess(scheduled, tokens)
        sizes.append(len(scheduled))
        step += 1
        assert step < 10_000, "no progress"
    return sizes


requests = st.lists(st.tuples(st.integers(0, 64), st.integers(1, 40), st.integers(1, 30),
                              st.one_of(st.none(), st.integers(0, 60))), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(requests=requests, policy=st.sampled_from(["guaranteed_no_evict", "max_utilization", "static"]),
       chunked=st.booleans(), reuse=st.booleans(), tokens_per_block=st.sampled_from([4, 8, 16]),
       pool_blocks=st.integers(7, 40), max_batch_size=st.integers(1, 6), seed=st.integers(0, 1000))
def test_no_block_leaks_once_everything_finishes_or_is_cancelled(requests, policy, chunked, reuse, tokens_per_block,
                                                                  pool_blocks, max_batch_size, seed):
    pool_tokens = pool_blocks * tokens_per_block
    config = EngineConfig(max_batch_size=max_batch_size, max_num_tokens=64 if chunked else 200,
                          tokens_per_block=tokens_per_block, max_tokens_in_paged_kv_cache=pool_tokens,
                          batch_scheduler_policy=policy, enable_chunked_context=chunked, enable_kv_cache_reuse=reuse)
    scheduler = Scheduler(config)
    seqs, cancel_at = [], {}
    for i, (shared, own, out, cancel) in enumerate(requests):
        prompt = PREFIX[:shared] + [1000 + i] * own
        if len(prompt) + out > pool_tokens:
            continue
        seqs.append(Sequence(i, prompt, SamplingParams(max_tokens=out)))
        if cancel is not None:
            cancel_at[i] = cancel
    sizes = drive(scheduler, seqs, cancel_at, seed)
    manager = scheduler.block_manager
    assert manager.num_free_blocks == manager.num_blocks and all(b.ref_count == 0 for b in manager.blocks)
    assert all(seq.is_finished for seq in seqs)
    assert all(seq.finish_reason == "cancelled" or seq.num_output_tokens == seq.params.max_tokens for seq in seqs)
    assert max(sizes, default=0) <= max_batch_size
    if policy != "max_utilization":
        assert scheduler.num_preemptions == 0


@settings(max_examples=40, deadline=None)
@given(shared=st.integers(0, 64), first=st.integers(1, 20), second=st.integers(1, 20),
       tokens_per_block=st.sampled_from([4, 8, 16]))
def test_shared_prefixes_hit_every_full_block(shared, first, second, tokens_per_block):
    scheduler = Scheduler(EngineConfig(tokens_per_block=tokens_per_block, max_tokens_in_paged_kv_cache=2048))
    a = Sequence(0, PREFIX[:shared] + [1] * first, SamplingParams(max_tokens=3))
    b = Sequence(1, PREFIX[:shared] + [2] * second, SamplingParams(max_tokens=3))
    drive(scheduler, [a], {}, 0)
    scheduler.add(b)
    scheduler.schedule()
    expected = min(shared, len(b) - 1) // tokens_per_block  # the last prompt token is always computed
    assert b.num_cached_tokens == expected * tokens_per_block
    assert scheduler.block_manager.num_reused_blocks == expected
    assert b.num_scheduled_tokens == len(b) - b.num_cached_tokens


def test_identical_hash_with_different_tokens_is_a_miss():
    scheduler = Scheduler(EngineConfig(tokens_per_block=4, max_tokens_in_paged_kv_cache=256))
    drive(scheduler, [Sequence(0, list(range(9)), SamplingParams(max_tokens=1))], {}, 0)
    manager = scheduler.block_manager
    block = manager.blocks[manager.hash_to_block_id[next(iter(manager.hash_to_block_id))]]
    block.token_ids = [7, 7, 7, 7]  # as if another prefix had produced the same hash
    seq = Sequence(1, list(range(9)), SamplingParams(max_tokens=1))
    scheduler.add(seq)
    scheduler.schedule()
    assert seq.num_cached_tokens == 0


def pool_of(num_seqs: int, policy: str) -> tuple[Scheduler, list[Sequence]]:
    """A pool of 12 blocks of 4 tokens and ``num_seqs`` requests of 8 prompt + 8 output tokens (4 blocks each)."""
    scheduler = Scheduler(EngineConfig(max_batch_size=8, tokens_per_block=4, max_tokens_in_paged_kv_cache=48,
                                       batch_scheduler_policy=policy, enable_kv_cache_reuse=False))
    seqs = [Sequence(i, [10 + i] * 8, SamplingParams(max_tokens=8)) for i in range(num_seqs)]
    for seq in seqs:
        scheduler.add(seq)
    return scheduler, seqs


def test_max_utilization_preempts_when_the_pool_is_exhausted():
    scheduler, seqs = pool_of(5, "max_utilization")
    first = scheduler.schedule()
    assert len(first) == 5  # 5 × 2 prompt blocks fit; their growth does not
    scheduler.postprocess(first, [1] * 5)
    sizes = drive(scheduler, [], {}, 0)
    assert scheduler.num_preemptions > 0 and any(seq.num_preemptions for seq in seqs)
    assert all(seq.num_output_tokens == 8 for seq in seqs) and max(sizes) <= 5


def test_guaranteed_no_evict_queues_instead():
    scheduler, seqs = pool_of(5, "guaranteed_no_evict")
    assert len(scheduler.schedule()) == 3  # 3 × 4 blocks reserved for the full length; 2 wait
    assert [s.seq_id for s in scheduler.waiting] == [3, 4]
    sizes = drive(scheduler, [], {}, 0)
    assert scheduler.num_preemptions == 0 and max(sizes) == 3
    assert all(seq.num_output_tokens == 8 for seq in seqs)
