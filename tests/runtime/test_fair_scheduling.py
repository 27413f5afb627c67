"""Fairness across requests in the CPU runtime: one request's ``n`` choices filling the batch never keep a newly
arrived request out of it (it starts at the next step, ahead of the choices still queued), the choices preempted
for it still return exactly the tokens of an undisturbed run, requests settle at equal shares without preempting
back and forth, and equal single-sequence requests are never preempted for one another."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trtllm_kit.checkpoint.convert import convert_checkpoint
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.executor import Executor
from trtllm_kit.runtime.model import CheckpointModel
from trtllm_kit.runtime.sequence import SamplingParams, Sequence, SequenceStatus

torch.set_num_threads(1)
PROMPT = list(range(3, 21))
NEIGHBOUR = list(range(40, 47))


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> CheckpointModel:
    root = tmp_path_factory.mktemp("ckpt")
    convert_checkpoint(builtin_dir("tiny-llama"), root, tp_size=1, pp_size=1, dtype="float32")
    return CheckpointModel.load(Path(root))


def engine_for(model: CheckpointModel, policy: str, batch: int = 4) -> Executor:
    return Executor(model, EngineConfig(max_batch_size=batch, tokens_per_block=4, max_tokens_in_paged_kv_cache=1024,
                                      batch_scheduler_policy=policy))


def many(n: int, max_tokens: int = 24) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=1.0, top_p=1.0, seed=7, n=n, logprobs=2)


def finish(engine: Executor) -> None:
    for _ in range(500):
        if not engine.has_work():
            return
        engine.step()
    raise AssertionError("the engine did not finish in 500 steps")


@pytest.mark.parametrize("policy", ["guaranteed_no_evict", "max_utilization"])
def test_a_newcomer_starts_at_the_next_step_while_another_requests_choices_fill_the_batch(model, policy):
    alone = engine_for(model, policy)
    undisturbed = alone.add_request(PROMPT, many(6))
    finish(alone)

    engine = engine_for(model, policy)
    big = engine.add_request(PROMPT, many(6))
    for _ in range(3):
        engine.step()
    assert sum(seq.status is SequenceStatus.RUNNING for seq in big.group) == 4  # the batch is full of its choices
    neighbour = engine.add_request(NEIGHBOUR, SamplingParams(max_tokens=4, top_k=1))
    engine.step()
    assert neighbour.status is SequenceStatus.RUNNING and neighbour.num_output_tokens == 1
    assert neighbour.num_preemptions == 0
    assert sum(seq.num_preemptions for seq in big.group) == 1  # one choice made room, and only one
    steps = 1
    while not neighbour.is_finished:
        engine.step()
        steps += 1
    assert steps == 4  # one token per step: it never waited for the choices
    assert not all(seq.is_finished for seq in big.group)  # answered while the big request still runs
    finish(engine)
    assert [s.output_ids for s in big.group] == [s.output_ids for s in undisturbed.group]
    assert [[t.token_id for t in s.output_logprobs] for s in big.group] == [s.output_ids for s in big.group]
    solo = engine_for(model, policy).generate([NEIGHBOUR], [SamplingParams(max_tokens=4, top_k=1)])[0]
    assert neighbour.output_ids == solo


def test_requests_settle_at_equal_shares_and_nobody_is_preempted_below_them(model):
    engine = engine_for(model, "guaranteed_no_evict")
    first = engine.add_request(PROMPT, many(8, max_tokens=40))
    engine.step()
    engine.step()
    second = engine.add_request(NEIGHBOUR, many(8, max_tokens=40))
    shares = []
    for _ in range(6):
        engine.step()
        shares.append([sum(s.status is SequenceStatus.RUNNING for s in r.group) for r in (first, second)])
    assert shares[-1] == [2, 2]
    preempted = engine.scheduler.num_preemptions
    for _ in range(10):
        engine.step()
    assert engine.scheduler.num_preemptions == preempted  # balanced: nobody is preempted any more
    finish(engine)
    assert all(len(s.output_ids) == 40 for r in (first, second) for s in r.group)

    singles = engine_for(model, "guaranteed_no_evict", batch=2)  # one sequence each: first come, first served
    running = [singles.add_request(PROMPT[:8 + i], SamplingParams(max_tokens=10, top_k=1)) for i in range(2)]
    singles.step()
    late = singles.add_request(NEIGHBOUR, SamplingParams(max_tokens=3, top_k=1))
    for _ in range(5):
        singles.step()
    assert late.status is SequenceStatus.WAITING and singles.scheduler.num_preemptions == 0
    assert all(seq.status is SequenceStatus.RUNNING for seq in running)

    static = engine_for(model, "static")  # a static batch is never broken up
    big: Sequence = static.add_request(PROMPT, many(6))
    static.step()
    newcomer = static.add_request(NEIGHBOUR, SamplingParams(max_tokens=3, top_k=1))
    static.step()
    assert newcomer.status is SequenceStatus.WAITING and static.scheduler.num_preemptions == 0
    finish(static)
    assert all(seq.is_finished for seq in [*big.group, newcomer])
