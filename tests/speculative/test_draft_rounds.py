"""The BLS's draft-target rounds without Triton: over scripted models they answer the target's own greedy output
(max_tokens, its end id, stop words across rounds, the minimum length), send upstream's fields on each call, and
count the accepted draft tokens; the CPU runtime verifies ``draft_input_ids`` in its step, equal to the output
without them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from trtllm_kit.checkpoint.convert import convert_checkpoint
from trtllm_kit.errors import KitUsageError
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.executor import Executor
from trtllm_kit.runtime.external_drafts import ExternalDrafts, remaining_draft
from trtllm_kit.runtime.model import CheckpointModel
from trtllm_kit.runtime.request import sampling_params
from trtllm_kit.runtime.sequence import SamplingParams
from trtllm_kit.runtime.speculation import Speculator
from trtllm_kit.triton_models.draft_rounds import (
    DraftTargetLoop,
    TargetCall,
    acceptance_arrays,
    accepted_prefix,
    call_arrays,
    chunks,
    request_loop,
)
from trtllm_kit.wire.rules import WireError
from trtllm_kit.wire.trtllm import decode_trtllm_request, encode_trtllm_request, word_list

VOCAB = 50


def next_token(tokens: list[int]) -> int:
    """The scripted target's greedy choice."""
    return (sum(tokens) * 7 + len(tokens)) % VOCAB


def greedy(prompt: list[int], max_tokens: int, end_id: int | None = None, stop_words: tuple[list[int], ...] = (),
           min_length: int = 0) -> list[int]:
    """The target's output without speculation (the end id left out, a stop word kept)."""
    out: list[int] = []
    while len(out) < max_tokens:
        token = next_token([*prompt, *out])
        if token == end_id:  # ends the output, or under the minimum length is masked (the next id taken)
            if len(out) >= min_length:
                break
            token = (token + 1) % VOCAB
        out.append(token)
        if any(out[-len(w):] == w for w in stop_words):
            break
    return out


class Scripted:
    """A draft that is wrong at every ``wrong_every``-th token, and the target verifying its drafts as the engine
    does; both record what they were sent."""

    def __init__(self, wrong_every: int, end_id: int | None = None, stop_words: tuple[list[int], ...] = ()) -> None:
        self.wrong_every, self.end_id, self.stop_words = wrong_every, end_id, stop_words
        self.draft_calls: list[tuple[int, int]] = []
        self.target_calls: list[TargetCall] = []

    def draft(self, tokens: list[int], num_tokens: int) -> list[int]:
        self.draft_calls.append((len(tokens), num_tokens))
        out: list[int] = []
        for i in range(num_tokens):
            token = next_token([*tokens, *out])
            out.append((token + 1) % VOCAB if (len(tokens) + i) % self.wrong_every == 0 else token)
        return out

    def target(self, call: TargetCall) -> list[int]:
        self.target_calls.append(call)
        out: list[int] = []
        for position in range(call.max_tokens):  # accepted draft tokens, then its own
            token = next_token([*call.token_ids, *out])
            if token == self.end_id:
                if len(out) >= call.min_length:
                    break
                token = (token + 1) % VOCAB
            out.append(token)
            if any(out[-len(w):] == w for w in self.stop_words):  # the runtime sees its own output only
                break
            if position >= len(call.draft_ids) or token != call.draft_ids[position]:
                break
        return out


def run(models: Scripted, prompt: list[int], max_tokens: int, k: int, **kwargs) -> tuple[list[int], DraftTargetLoop]:
    loop = DraftTargetLoop(prompt, max_tokens, k, models.draft, models.target, **kwargs)
    return [t for done in loop.rounds() for t in done.token_ids], loop


@pytest.mark.parametrize("wrong_every", [1, 3, 1000])
@pytest.mark.parametrize("k", [1, 4])
def test_rounds_answer_the_targets_greedy_output_and_count_what_it_kept(wrong_every: int, k: int) -> None:
    models = Scripted(wrong_every)
    output, loop = run(models, [3, 1, 4], 17, k)
    assert output == greedy([3, 1, 4], 17)
    drafted = [len(c.draft_ids) for c in models.target_calls]
    assert loop.acceptance.total_draft_tokens == sum(drafted) > 0
    kept = [accepted_prefix(c.draft_ids, greedy(c.token_ids, len(c.draft_ids))) for c in models.target_calls]
    assert loop.acceptance.total_accepted_draft_tokens == sum(kept)
    if wrong_every == 1:
        assert loop.acceptance.acceptance_rate == 0.0 and len(models.target_calls) == 17
    if wrong_every == 1000:  # all kept: k + 1 tokens a round
        assert loop.acceptance.acceptance_rate == 1.0 and len(models.target_calls) == -(-17 // (k + 1))
    # each target call asks one token more than its draft, the draft as long as max_tokens leaves room for
    assert all(c.max_tokens == len(c.draft_ids) + 1 for c in models.target_calls)
    assert models.target_calls[-1].draft_ids == [] or len(output) - len(models.target_calls[-1].token_ids) + 3 <= k
    assert all(n == min(k, 17 - (length - 3) - 1) for length, n in models.draft_calls)


def test_the_end_id_ends_the_rounds_and_the_minimum_length_holds_it_off() -> None:
    prompt = [3, 1, 4]
    reference = greedy(prompt, 9)
    end_id = reference[6]
    models = Scripted(3, end_id=end_id)
    output, _ = run(models, prompt, 30, 4, end_id=end_id)
    assert output == greedy(prompt, 30, end_id) and len(output) == reference.index(end_id)
    models = Scripted(3, end_id=end_id)
    output, _ = run(models, prompt, 12, 4, end_id=end_id, min_length=9)
    assert output == greedy(prompt, 12, end_id, min_length=9) and len(output) >= 9
    first = models.target_calls[0]
    assert first.min_length == min(9, first.max_tokens) and models.target_calls[-1].min_length == 0


def test_a_stop_word_across_rounds_ends_there() -> None:
    prompt = [2, 7]
    reference = greedy(prompt, 20)
    for start in range(1, 8):  # a two-token word at every offset: some span a round's boundary
        word = reference[start:start + 2]
        models = Scripted(2, stop_words=(word,))
        output, _ = run(models, prompt, 20, 3, stop_words=[word])
        assert output == greedy(prompt, 20, stop_words=(word,)), start


def test_streamed_chunks_are_the_rounds_and_whole_is_one() -> None:
    loop = DraftTargetLoop([3, 1, 4], 10, 2, Scripted(3).draft, Scripted(3).target)
    streamed = list(chunks(loop, True))
    loop = DraftTargetLoop([3, 1, 4], 10, 2, Scripted(3).draft, Scripted(3).target)
    assert len(streamed) > 1 and list(chunks(loop, False)) == [[t for c in streamed for t in c]]


def test_each_call_carries_upstreams_fields() -> None:
    request = {"input_ids": np.array([[5, 6, 7]], np.int32), "input_lengths": np.array([[3]], np.int32),
               "request_output_len": np.array([[9]], np.int32), "streaming": np.array([[True]]),
               "stop_words_list": word_list(((8,),))[None], "lora_task_id": np.array([[1]], np.uint64),
               "temperature": np.array([[0.0]], np.float32), "end_id": np.array([[2]], np.int32)}
    target = call_arrays(request, [5, 6, 7, 1], 3, 0, [1, 2])
    assert target["draft_input_ids"].tolist() == [[1, 2]] and target["request_output_len"].tolist() == [[3]]
    assert target["input_ids"].tolist() == [[5, 6, 7, 1]] and target["input_lengths"].tolist() == [[4]]
    assert not target["streaming"].any() and target["exclude_input_in_output"].all()
    assert {"stop_words_list", "lora_task_id", "temperature", "end_id"} <= set(target)
    draft = call_arrays(request, [5, 6, 7], 4, 4)
    assert draft["min_tokens"].tolist() == [[4]] and "draft_input_ids" not in draft
    assert "stop_words_list" not in draft and "lora_task_id" not in draft and "temperature" in draft
    sent: list[tuple[str, dict[str, np.ndarray]]] = []

    def call(name: str, arrays: dict[str, np.ndarray]) -> tuple[list[int], np.ndarray | None]:
        sent.append((name, arrays))
        return ([1, 2], np.arange(2 * VOCAB, dtype=np.float32).reshape(1, 1, 2, VOCAB)) if name == "d" else ([1], None)

    loop = request_loop(request, 2, call, ("d", "t"), use_draft_logits=True)
    assert loop.prompt_ids == [5, 6, 7] and loop.max_tokens == 9 and loop.end_id == 2 and loop.stop_words == [[8]]
    next(loop.rounds())
    assert [name for name, _ in sent] == ["d", "t"] and sent[0][1]["return_generation_logits"].all()
    assert sent[1][1]["draft_logits"].shape == (1, 2, VOCAB)
    assert acceptance_arrays(loop.acceptance)["total_draft_tokens"].tolist() == [[2]]


def test_refusals_name_the_field() -> None:
    request = {"input_ids": np.array([[5]], np.int32), "request_output_len": np.array([[4]], np.int32)}
    with pytest.raises(KitUsageError, match=r"^num_draft_tokens is 3, but this tensorrt_llm_bls names no draft"):
        request_loop(request, 3, lambda name, arrays: ([], None), ("", "tensorrt_llm"))
    with pytest.raises(KitUsageError, match=r"^return_log_probs is not answered with speculation"):
        request_loop({**request, "return_log_probs": np.array([[True]])}, 3, lambda n, a: ([], None), ("d", "t"))
    with pytest.raises(WireError, match=r"^draft_logits is not used by the CPU runtime"):
        decode_trtllm_request({**request, "draft_logits": np.zeros((1, 1, 4), np.float32)})
    decoded = decode_trtllm_request({**request, "draft_input_ids": np.array([[7, 8]], np.int32)})
    assert decoded.draft_ids == (7, 8) and sampling_params(decoded).draft_ids == (7, 8)
    assert encode_trtllm_request(decoded)["draft_input_ids"].tolist() == [7, 8]
    with pytest.raises(WireError, match=r"^draft_ids is not served by this model: it declares no draft_input_ids"):
        encode_trtllm_request(decoded, {"input_ids": "INT32", "input_lengths": "INT32", "request_output_len": "INT32"})


def test_the_remaining_draft_follows_the_output_only() -> None:
    assert remaining_draft((4, 5, 6), [4]) == [5, 6]
    assert remaining_draft((4, 5, 6), [9]) == [] and remaining_draft((4, 5, 6), [4, 5, 6]) == []


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> CheckpointModel:
    root: Path = tmp_path_factory.mktemp("ckpt")
    convert_checkpoint(builtin_dir("tiny-llama"), root, tp_size=1, pp_size=1, dtype="float32")
    return CheckpointModel.load(root)


def generate(engine: Executor, prompt: list[int], params: SamplingParams) -> tuple[list[int], int, int]:
    seq = engine.add_request(prompt, params)
    while engine.has_work():
        engine.step()
    return seq.output_ids, seq.draft_counts.num_draft_tokens, seq.draft_counts.num_accepted_tokens


def test_the_runtime_verifies_draft_input_ids_in_its_step(tiny: CheckpointModel) -> None:
    torch.set_num_threads(1)
    prompt = [5, 77, 301, 9, 640, 12]
    plain = Executor(tiny, EngineConfig())
    reference, _, _ = generate(plain, prompt, SamplingParams(max_tokens=12, top_k=1))
    engine = Executor(tiny, EngineConfig(), Speculator(ExternalDrafts(), 64))
    right = tuple(reference[:5])
    out, drafted, accepted = generate(engine, prompt, SamplingParams(max_tokens=6, top_k=1, draft_ids=right))
    assert out == reference[:6] and (drafted, accepted) == (4, 4)  # the first is the prompt step's token
    wrong = (*reference[:2], (reference[2] + 1) % 1000, *reference[3:5])
    out, drafted, accepted = generate(engine, prompt, SamplingParams(max_tokens=6, top_k=1, draft_ids=wrong))
    assert out == reference[:6] and (drafted, accepted) == (4, 1)
    out, drafted, _ = generate(engine, prompt, SamplingParams(max_tokens=6, top_k=1, draft_ids=(reference[0] + 1,)))
    assert out == reference[:6] and drafted == 0  # the first token left the draft: nothing to verify


def test_a_draft_token_outside_the_vocabulary_is_refused_at_admission(tiny: CheckpointModel) -> None:
    engine = Executor(tiny, EngineConfig(), Speculator(ExternalDrafts(), 64))
    with pytest.raises(KitUsageError, match=r"^draft_input_ids hold a token outside the vocabulary \[0, 1031\)"):
        engine.add_request([5, 77, 301], SamplingParams(max_tokens=4, top_k=1, draft_ids=(3, 1031)))
    assert not engine.has_work()
