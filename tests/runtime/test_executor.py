"""Batched, paged decoding equals a naive full-recompute loop token for token (greedy), with preemption,
chunked context and prefix reuse on; sampling settings behave as TensorRT-LLM's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trtllm_kit.checkpoint.convert import convert_checkpoint
from trtllm_kit.errors import KitUsageError
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.quant.algos import QuantConfig
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.executor import Executor
from trtllm_kit.runtime.handle import QueueFullError
from trtllm_kit.runtime.model import CheckpointModel
from trtllm_kit.runtime.sequence import SamplingParams
from trtllm_kit.runtime.threads import StepThreads

torch.set_num_threads(1)
VOCAB = 1031
# Mixed prompt and output lengths; the first four share a 40-token prefix (several 8-token blocks).
SHAPES = [(40, 3, 5), (40, 20, 30), (17, 5, 12), (0, 70, 40), (33, 1, 7), (40, 9, 25), (0, 2, 18)]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, CheckpointModel]:
    root = tmp_path_factory.mktemp("ckpt")
    made = {}
    int8 = QuantConfig(quant="int8-wo", kv_cache="int8", calib_samples=2, calib_seq_len=32)
    for name, model, tp, pp, quant in [("llama", "tiny-llama", 1, 1, None), ("llama-tp2-pp2", "tiny-llama", 2, 2, None),
                                       ("qwen2-tp2", "tiny-qwen2", 2, 1, None),
                                       ("llama-w8a16-int8kv-tp2", "tiny-llama", 2, 1, int8)]:
        convert_checkpoint(builtin_dir(model), root / name, tp_size=tp, pp_size=pp, dtype="float32", quant=quant)
        made[name] = CheckpointModel.load(Path(root / name))
    return made


def workload() -> tuple[list[list[int]], list[int]]:
    g = torch.Generator().manual_seed(0)
    shared = torch.randint(0, VOCAB, (40,), generator=g).tolist()
    prompts = [shared[:n] + torch.randint(0, VOCAB, (k,), generator=g).tolist() for n, k, _ in SHAPES]
    return prompts, [out for _, _, out in SHAPES]


def naive(model: CheckpointModel, prompt: list[int], max_tokens: int) -> list[int]:
    """Greedy decoding that recomputes the whole sequence for every token: no cache at all."""
    ids = list(prompt)
    for _ in range(max_tokens):
        ids.append(int(model.forward(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt):]


@pytest.fixture(scope="module")
def references(checkpoints) -> dict[str, list[list[int]]]:
    prompts, outs = workload()
    return {name: [naive(model, p, n) for p, n in zip(prompts, outs, strict=True)]
            for name, model in checkpoints.items() if name != "llama-tp2-pp2"}


CASES = {  # policy, chunked context, reuse, max_num_tokens, KV pool tokens
    "max_utilization+chunked+reuse": ("max_utilization", True, True, 24, 160),
    "max_utilization": ("max_utilization", False, False, 128, 160),
    "no_evict+chunked+reuse": ("guaranteed_no_evict", True, True, 32, 256),
    "static": ("static", False, True, 128, 400),
}


@pytest.mark.parametrize("case", CASES)
def test_batched_paged_decoding_equals_full_recompute(checkpoints, references, case):
    policy, chunked, reuse, max_num_tokens, pool = CASES[case]
    engine = Executor(checkpoints["llama"], EngineConfig(
        max_batch_size=4, max_num_tokens=max_num_tokens, tokens_per_block=8, max_tokens_in_paged_kv_cache=pool,
        batch_scheduler_policy=policy, enable_chunked_context=chunked, enable_kv_cache_reuse=reuse))
    prompts, outs = workload()
    got = engine.generate(prompts, [SamplingParams(max_tokens=n) for n in outs])
    assert got == references["llama"]
    stats = engine.stats()
    assert stats.blocks_used == 0 and stats.blocks_free == stats.blocks_max == pool // 8
    assert stats.peak_scheduled > 1
    if policy == "max_utilization":
        assert stats.preemptions > 0  # the pool holds 160 tokens, the batch needs more
    if reuse:
        assert stats.blocks_reused > 0
    if chunked:
        assert max(len(p) for p in prompts) > max_num_tokens


def test_split_biased_and_quantized_checkpoints(checkpoints, references):
    prompts, outs = workload()
    config = EngineConfig(max_batch_size=3, max_num_tokens=32, tokens_per_block=8, max_tokens_in_paged_kv_cache=200,
                          batch_scheduler_policy="max_utilization", enable_chunked_context=True)
    split = Executor(checkpoints["llama-tp2-pp2"], config).generate(prompts,
                                                                    [SamplingParams(max_tokens=n) for n in outs])
    torch.testing.assert_close(checkpoints["llama-tp2-pp2"].forward(torch.tensor([prompts[0]])),
                               checkpoints["llama"].forward(torch.tensor([prompts[0]])), atol=1e-4, rtol=0)
    assert split == references["llama"]
    for name in ("qwen2-tp2", "llama-w8a16-int8kv-tp2"):  # q/k/v biases; int8 weights and an int8 KV cache
        engine = Executor(checkpoints[name], config)
        assert engine.generate(prompts, [SamplingParams(max_tokens=n) for n in outs]) == references[name]
        assert engine.stats().preemptions > 0


def test_end_id_stop_words_and_min_tokens(checkpoints, references):
    model, ref = checkpoints["llama"], references["llama"][1]  # 30 greedy tokens of prompt 1
    prompts, _ = workload()
    engine = Executor(model, EngineConfig(tokens_per_block=8))
    end_id = ref[4]
    first = ref.index(end_id)
    stop = ref[6:8]
    out = engine.generate([prompts[1]] * 3, [SamplingParams(max_tokens=30, end_id=end_id),
                                             SamplingParams(max_tokens=30, stop_words=[[VOCAB + 5], stop]),
                                             SamplingParams(max_tokens=30, end_id=end_id, min_tokens=first + 3)])
    assert out[0] == ref[:first]  # end_id ends the sequence and is not part of the output
    assert out[1] == ref[:8]  # a stop word is kept in the output
    assert len(out[2]) >= first + 3 and end_id not in out[2][:first + 3] and out[2][:first] == ref[:first]


def test_sampling_is_seeded_per_request_and_top_k_1_is_greedy(checkpoints, references):
    model, (prompts, _) = checkpoints["llama"], workload()
    def run(batch: list[int], **kwargs) -> list[list[int]]:
        engine = Executor(model, EngineConfig(tokens_per_block=8, max_batch_size=len(batch)))
        return engine.generate([prompts[i] for i in batch], [SamplingParams(max_tokens=12, **kwargs)] * len(batch))
    sampled = dict(temperature=0.8, top_k=50, top_p=0.9, seed=7)
    alone, batched = run([1], **sampled), run([0, 1, 2], **sampled)
    assert alone[0] == batched[1]  # a request's tokens do not depend on its batch neighbours
    assert alone != run([1], **{**sampled, "seed": 8})
    assert run([1], temperature=2.0, top_k=1)[0] == references["llama"][1][:12]


def test_requests_that_cannot_run_are_refused(checkpoints):
    engine = Executor(checkpoints["llama"], EngineConfig(tokens_per_block=8, max_tokens_in_paged_kv_cache=64,
                                                       max_num_tokens=16, max_queue_size=1, max_batch_size=1))
    with pytest.raises(KitUsageError, match=r"needs up to 80 tokens of KV cache .* the pool holds 64"):
        engine.add_request([1] * 60, SamplingParams(max_tokens=20))
    with pytest.raises(KitUsageError, match="20 input tokens, more than max_num_tokens 16"):
        engine.add_request([1] * 20, SamplingParams(max_tokens=4))
    engine.add_request([1] * 4, SamplingParams(max_tokens=4))  # takes the free batch slot
    engine.add_request([1] * 4, SamplingParams(max_tokens=4))  # waits
    with pytest.raises(QueueFullError, match=r"queue is full \(1 requests wait for a batch slot, max_queue_size 1\)"):
        engine.add_request([1] * 4, SamplingParams(max_tokens=4))
    with pytest.raises(KitUsageError, match="batch_scheduler_policy is 'fifo'"):
        EngineConfig(batch_scheduler_policy="fifo")


def test_config_from_triton_parameters():
    config = EngineConfig.from_parameters({"max_batch_size": "4", "enable_chunked_context": "true",
                                           "batch_scheduler_policy": "max_utilization",
                                           "tokens_per_block": "${tokens_per_block}", "gpt_model_path": "/x"})
    assert (config.max_batch_size, config.enable_chunked_context, config.tokens_per_block) == (4, True, 32)
    with pytest.raises(KitUsageError, match="parameter max_num_tokens is 'many'; it must be an integer"):
        EngineConfig.from_parameters({"max_num_tokens": "many"})


def test_each_step_computes_with_the_threads_of_its_rows_and_the_same_outputs(checkpoints) -> None:
    """A server's ``step_threads``: one-row steps at one count, others at another, set on the stepping thread;
    greedy tokens and logprobs as at one count throughout."""
    prompts, outs = workload()
    params = [SamplingParams(max_tokens=n, logprobs=1) for n in outs[:3]]
    fixed = Executor(checkpoints["llama"], EngineConfig(max_batch_size=4))
    expected = [fixed.add_request(p, sp) for p, sp in zip(prompts[:3], params, strict=True)]
    while fixed.has_work():
        fixed.step()
    executor = Executor(checkpoints["llama"], EngineConfig(max_batch_size=4))
    executor.step_threads = StepThreads(1, 2)
    seqs = [executor.add_request(p, sp) for p, sp in zip(prompts[:3], params, strict=True)]
    seen = []
    try:
        while executor.has_work():
            executor.step()
            seen.append((executor.last_tokens, torch.get_num_threads()))
    finally:
        torch.set_num_threads(1)
    assert all(threads == (1 if rows == 1 else 2) for rows, threads in seen) and {t for _, t in seen} == {1, 2}
    assert [s.output_ids for s in seqs] == [s.output_ids for s in expected]
    assert [s.output_logprobs for s in seqs] == [s.output_logprobs for s in expected]
