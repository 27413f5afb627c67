"""The CPU ``LLM`` class's evaluation fields, as the LLM API names them: ``logprobs`` / ``prompt_logprobs`` dicts
of ``Logprob(logprob, rank)`` equal to the runtime's raw logprobs, ``n`` / ``best_of``, the penalties, and
``guided_decoding`` with the xgrammar backend giving schema-valid JSON."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import jsonschema
import pytest
import torch

from trtllm_kit.errors import KitUsageError
from trtllm_kit.llmapi.cpu_llm import LLM, GuidedDecodingParams, SamplingParams
from trtllm_kit.llmapi.load import load_unified
from trtllm_kit.llmapi.unified import write_unified
from trtllm_kit.models.inspect import inspect_model
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.executor import Executor
from trtllm_kit.runtime.sequence import SamplingParams as RuntimeParams

torch.set_num_threads(1)
PROMPT = [1, 415, 565, 37, 902, 11]
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "size": {"enum": ["s", "m", "l"]}},
          "required": ["ok", "size"], "additionalProperties": False}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ckpt")
    write_unified(inspect_model("builtin:tiny-llama"), out, "float32")
    return out


@pytest.fixture(scope="module")
def llm(ckpt: Path):
    made = LLM(model=str(ckpt), max_seq_len=256, guided_decoding_backend="xgrammar")
    yield made
    made.shutdown()


def generate(llm: LLM, params: SamplingParams, streaming: bool = False):
    async def go():
        result = llm.generate_async(PROMPT, params, streaming=streaming)
        if streaming:
            return [[list(c.token_ids_diff) for c in output.outputs] async for output in result], result
        return None, await result.aresult()
    return asyncio.run(asyncio.wait_for(go(), 120))


def runtime(ckpt: Path, params: RuntimeParams):
    engine = Executor(load_unified(ckpt), EngineConfig())
    first = engine.add_request(PROMPT, params)
    while engine.has_work():
        engine.step()
    return first


def test_logprobs_and_prompt_logprobs_have_the_llm_api_shape(llm, ckpt):
    _, result = generate(llm, SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True, logprobs=3,
                                             prompt_logprobs=2))
    out = result.outputs[0]
    seq = runtime(ckpt, RuntimeParams(max_tokens=5, temperature=0.0, logprobs=3, prompt_logprobs=2))
    assert out.token_ids == seq.output_ids
    assert len(out.logprobs) == 5
    for token, entry, expected in zip(out.token_ids, out.logprobs, seq.output_logprobs, strict=True):
        assert entry[token].logprob == pytest.approx(expected.logprob, abs=1e-5)
        assert entry[token].rank == 1  # greedy
        assert sorted(lp.rank for lp in entry.values()) == [1, 2, 3]
        assert [entry[i].logprob for i in expected.top_ids] == pytest.approx(list(expected.top_logprobs), abs=1e-5)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(PROMPT)
    for token, entry, expected in zip(PROMPT[1:], out.prompt_logprobs[1:], seq.prompt_logprobs[1:], strict=True):
        assert entry[token].logprob == pytest.approx(expected.logprob, abs=1e-5)
        assert entry[token].rank == expected.rank and len(entry) in (2, 3)
    assert out.cumulative_logprob == pytest.approx(sum(e.logprob for e in seq.output_logprobs), abs=1e-4)


def test_keep_end_token_returns_the_end_token_with_its_logprob(llm):
    """The kit's ``keep_end_token``: a completion that ends on the end token has it as its last token, with its
    logprob, finish reason ``stop``, and text without it; without the field the token is left out (the LLM API's)."""
    ending = [1, 38, 562, 603, 287, 498, 267, 422, 346, 266, 641, 651, 285, 769, 302, 447, 333, 734]

    async def one(keep: bool):
        params = SamplingParams(max_tokens=3, temperature=0.0, logprobs=1, keep_end_token=keep)
        return (await asyncio.wait_for(llm.generate_async(ending, params).aresult(), 120)).outputs[0]

    left_out, kept = asyncio.run(one(False)), asyncio.run(one(True))
    eos = llm.eos_token_id
    assert left_out.token_ids == [] and left_out.logprobs == [] and left_out.finish_reason == "stop"
    assert kept.token_ids == [eos] and kept.finish_reason == "stop" and kept.text == ""
    [entry] = kept.logprobs
    assert entry[eos].rank == 1 and kept.cumulative_logprob == pytest.approx(entry[eos].logprob, abs=1e-6)


def test_n_sequences_stream_and_match_the_runtime(llm, ckpt):
    params = SamplingParams(max_tokens=6, temperature=1.0, top_p=1.0, seed=4, n=3, ignore_eos=True)
    steps, result = generate(llm, params, streaming=True)
    assert [c.index for c in result.outputs] == [0, 1, 2]
    streamed = [[token for step in steps for token in step[i]] for i in range(3)]
    group = runtime(ckpt, RuntimeParams(max_tokens=6, temperature=1.0, top_p=1.0, seed=4, n=3)).group
    assert streamed == [c.token_ids for c in result.outputs] == [seq.output_ids for seq in group]


def test_a_stream_read_late_still_gives_one_step_per_output(llm):
    """A loop that blocks while the engine runs ahead finds several steps queued: each streamed output still holds
    at most one step of each sequence (as TensorRT-LLM's results do), none merged into a bigger piece."""
    params = SamplingParams(max_tokens=12, temperature=1.0, top_p=1.0, seed=6, n=2, ignore_eos=True)

    async def go():
        steps, result = [], llm.generate_async(PROMPT, params, streaming=True)
        async for output in result:
            steps.append([list(c.token_ids_diff) for c in output.outputs])
            if len(steps) == 1:
                time.sleep(1.0)  # blocks the loop: the engine thread queues the next steps meanwhile
        return steps, result
    steps, result = asyncio.run(asyncio.wait_for(go(), 120))
    assert all(len(piece) <= 1 for step in steps for piece in step)  # a sequence's next step can come an output later
    assert [[t for step in steps for t in step[i]] for i in range(2)] == [c.token_ids for c in result.outputs]


def test_best_of_keeps_the_most_likely(llm):
    _, result = generate(llm, SamplingParams(max_tokens=5, temperature=1.0, top_p=1.0, seed=9, n=2, best_of=5,
                                             ignore_eos=True))
    assert [c.index for c in result.outputs] == [0, 1]
    assert result.outputs[0].cumulative_logprob >= result.outputs[1].cumulative_logprob


def test_penalties_reach_the_runtime(llm, ckpt):
    """Greedy decoding of this prompt repeats a token at position 18; the penalties steer it elsewhere."""
    fields = {"repetition_penalty": 1.5, "presence_penalty": 0.5, "frequency_penalty": 0.4, "min_p": 0.02}
    _, result = generate(llm, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, **fields))
    assert result.outputs[0].token_ids == runtime(ckpt, RuntimeParams(max_tokens=24, temperature=0.0,
                                                                      **fields)).output_ids
    _, plain = generate(llm, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))
    assert plain.outputs[0].token_ids[:18] == result.outputs[0].token_ids[:18]
    assert plain.outputs[0].token_ids[18:] != result.outputs[0].token_ids[18:]
    with pytest.raises(KitUsageError, match=r"^repetition_penalty must be a number greater than 0"):
        llm.generate_async(PROMPT, SamplingParams(repetition_penalty=-1.0))


def test_guided_decoding_gives_schema_valid_json(llm):
    for seed in range(5):
        _, result = generate(llm, SamplingParams(max_tokens=60, temperature=1.0, top_p=1.0, seed=seed, n=2,
                                                 guided_decoding=GuidedDecodingParams(json=SCHEMA)))
        for out in result.outputs:
            assert out.finish_reason == "stop"
            jsonschema.validate(json.loads(out.text), SCHEMA)
    _, result = generate(llm, SamplingParams(max_tokens=20, temperature=1.0, top_p=1.0, seed=1,
                                             guided_decoding=GuidedDecodingParams(regex="[0-9]{4}")))
    assert result.outputs[0].text.isdigit() and len(result.outputs[0].text) == 4


def test_guided_decoding_needs_the_xgrammar_backend(ckpt):
    plain = LLM(model=str(ckpt), max_seq_len=64)
    try:
        with pytest.raises(ValueError, match="guided_decoding_backend: xgrammar"):
            plain.generate_async(PROMPT, SamplingParams(guided_decoding=GuidedDecodingParams(json_object=True)))
    finally:
        plain.shutdown()
    with pytest.raises(ValueError, match="only one guide may be set in GuidedDecodingParams, got json, regex"):
        GuidedDecodingParams(json="{}", regex="a")
