"""The OpenAI fields evaluation and benchmark clients send, against a served tiny model: stop strings beyond four
and ``include_stop_str_in_output``, the sampling extras, completions ``logprobs`` and ``echo`` (what lm-eval's
loglikelihood sends, checked against ``transformers`` on the same weights in float32), chat ``logprobs``."""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import jsonschema
import openai
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from serving_helpers import MODEL, post, wait_idle
from transformers import AutoModelForCausalLM, AutoTokenizer

from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.serve.frontend import OpenAIFrontend, start_frontend
from trtllm_kit.serve.openai.config import OpenAIConfig
from trtllm_kit.serve.openai.routes import Route
from trtllm_kit.serve.server.launcher import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def client(state: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{state['openai']}/v1", api_key="none", max_retries=0)


def greedy(state: dict[str, Any], **fields: Any) -> str:
    extra = {k: fields.pop(k) for k in list(fields) if k not in ("stop", "max_tokens", "seed", "temperature")}
    answer = client(state).completions.create(model=MODEL, prompt="Once upon a time", temperature=0,
                                              extra_body=extra, **{"max_tokens": 24, **fields})
    return answer.choices[0].text


def test_many_stop_strings_and_the_stop_string_shown(served: dict[str, Any]) -> None:
    text = greedy(served)
    stop = text[6:9]
    cut = text.find(stop)
    others = [f"never-{i}" for i in range(20)]
    assert greedy(served, stop=[*others, stop]) == text[:cut]
    assert greedy(served, stop=[*others, stop], include_stop_str_in_output=True) == text[:cut + len(stop)]


def sampled(state: dict[str, Any], **extra: Any) -> str:
    answer = client(state).completions.create(model=MODEL, prompt="Once upon a time", max_tokens=24, temperature=1.0,
                                              seed=7, extra_body=extra)
    return answer.choices[0].text


def test_sampling_extras_reach_the_engine(served: dict[str, Any]) -> None:
    text = greedy(served)
    assert sampled(served, top_k=1) == text and sampled(served, min_p=1.0) == text  # both keep the top token only
    assert sampled(served) != text  # so sampling at temperature 1 differs without them
    assert greedy(served, repetition_penalty=2.0) != text
    assert greedy(served, frequency_penalty=2.0) != text
    assert greedy(served, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, top_k=-1) == text


@pytest.mark.parametrize(("field", "value", "message"), [
    ("min_p", 1.5, "min_p must be a number in [0, 1], got 1.5; send one that is, or leave min_p out."),
    ("repetition_penalty", -1, "repetition_penalty must be a number greater than 0, got -1.0; send one that is, or "
                               "leave repetition_penalty out."),
    ("top_k", "5", "top_k must be an integer from 0 to 2**31 - 1, got '5'; send one that is, or leave top_k out."),
])
def test_an_extra_out_of_range_is_a_400_naming_it(served: dict[str, Any], field: str, value: Any,
                                                  message: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        greedy(served, **{field: value})
    assert info.value.body == {"message": message, "type": "invalid_request_error", "param": field, "code": None}


def reference_logprobs(ids: list[int]) -> tuple[list[float], list[int]]:
    """``transformers``' log-softmax of the same model: each prompt token's logprob after the first, and the
    most likely token at each position."""
    model = AutoModelForCausalLM.from_pretrained(builtin_dir("tiny-llama"), torch_dtype=torch.float32)
    with torch.no_grad():
        scores = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
    return [float(scores[i - 1, t]) for i, t in enumerate(ids) if i > 0], scores.argmax(-1).tolist()


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_echoed_prompt_logprobs_equal_transformers(served32: dict[str, Any], max_tokens: int) -> None:
    tokenizer = AutoTokenizer.from_pretrained(builtin_dir("tiny-llama"))
    ids = tokenizer("The quick brown fox jumps over the lazy dog").input_ids
    answer = client(served32).completions.create(model=MODEL, prompt=[ids], max_tokens=max_tokens, logprobs=1,
                                                 echo=True, temperature=0)
    expected, best = reference_logprobs(ids)
    logprobs = answer.choices[0].logprobs
    assert logprobs is not None and logprobs.token_logprobs is not None and logprobs.top_logprobs is not None
    assert len(logprobs.token_logprobs) == len(ids) + max_tokens
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert logprobs.token_logprobs[1:len(ids)] == pytest.approx(expected, abs=1e-3)
    assert logprobs.text_offset is not None and logprobs.text_offset == sorted(logprobs.text_offset)
    top = logprobs.top_logprobs[1]  # the most likely token, then the prompt's own when it is another (OpenAI's k + 1)
    most_likely, own = tokenizer.decode([best[0]]), tokenizer.decode([ids[1]])
    assert next(iter(top)) == most_likely and len(top) == (1 if own == most_likely else 2)
    assert top[own] == pytest.approx(expected[0], abs=1e-3)
    assert answer.usage is not None and answer.usage.completion_tokens == max_tokens
    assert answer.usage.prompt_tokens == len(ids)
    if max_tokens:  # the greedy token is the most likely one, and its logprob is that of the last position
        assert logprobs.top_logprobs[-1] is not None and len(logprobs.top_logprobs[-1]) == 1


def test_generated_logprobs_whole_and_streamed(served32: dict[str, Any]) -> None:
    openai_client = client(served32)
    whole = openai_client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, logprobs=3,
                                             temperature=0)
    logprobs = whole.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens is not None and logprobs.top_logprobs is not None
    assert len(logprobs.tokens) == 8 and all(len(top) <= 3 for top in logprobs.top_logprobs if top is not None)
    assert all(lp <= 0 for lp in logprobs.token_logprobs or [])
    streamed = openai_client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, logprobs=3,
                                                temperature=0, stream=True)
    tokens, values = [], []
    for chunk in streamed:
        if chunk.choices and chunk.choices[0].logprobs is not None:
            tokens += chunk.choices[0].logprobs.tokens or []
            values += chunk.choices[0].logprobs.token_logprobs or []
    assert tokens == logprobs.tokens and values == pytest.approx(logprobs.token_logprobs, abs=1e-5)


def test_chat_logprobs_with_top_alternatives(served32: dict[str, Any]) -> None:
    answer = client(served32).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5, logprobs=True, top_logprobs=2,
        temperature=0)
    content = answer.choices[0].logprobs and answer.choices[0].logprobs.content
    assert content is not None and len(content) == 5
    for entry in content:
        assert entry.bytes == list(entry.token.encode()) and len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob >= entry.logprob - 1e-5  # the most likely comes first


def test_echo_without_logprobs_repeats_the_prompt(served: dict[str, Any]) -> None:
    answer = client(served).completions.create(model=MODEL, prompt="Once upon a time", max_tokens=4, echo=True,
                                               temperature=0)
    assert answer.choices[0].text.startswith("Once upon a time") and answer.choices[0].logprobs is None
    assert json.loads(answer.model_dump_json())["usage"]["completion_tokens"] == 4


def test_several_prompts_and_n_choices_in_index_order(served: dict[str, Any]) -> None:
    prompts = ["Once upon a time", "The weather today", "Once upon a time"]
    answer = client(served).completions.create(model=MODEL, prompt=prompts, n=2, best_of=2, max_tokens=6,
                                               temperature=1.0, seed=3)
    assert [c.index for c in answer.choices] == list(range(6))
    singles = [client(served).completions.create(model=MODEL, prompt=p, max_tokens=6, temperature=1.0, seed=3 + j)
               for p in prompts for j in range(2)]
    assert [c.text for c in answer.choices] == [s.choices[0].text for s in singles]  # choice i*n+j: seed + j
    assert answer.choices[0].text != answer.choices[1].text
    assert answer.usage is not None and answer.usage.completion_tokens == sum(
        s.usage.completion_tokens for s in singles if s.usage)
    assert answer.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles[::2] if s.usage)
    greedy_ids = client(served).completions.create(model=MODEL, prompt=[[1, 45], [1, 45, 96]], max_tokens=4,
                                                   temperature=0)
    assert len(greedy_ids.choices) == 2


def streamed_choices(chunks: Any) -> tuple[dict[int, dict[str, Any]], Any]:
    """Each choice's streamed text, tokens, logprobs and finish reason by index, and the usage chunk's usage."""
    found: dict[int, dict[str, Any]] = {}
    usage = None
    for chunk in chunks:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            seen = found.setdefault(choice.index, {"text": "", "tokens": [], "logprobs": [], "finish": None})
            delta = getattr(choice, "delta", None)
            seen["text"] += (choice.text if delta is None else delta.content) or ""
            if choice.logprobs is not None:
                entries = getattr(choice.logprobs, "content", None)
                if entries is None:
                    seen["tokens"] += choice.logprobs.tokens or []
                    seen["logprobs"] += choice.logprobs.token_logprobs or []
                else:
                    seen["tokens"] += [e.token for e in entries]
                    seen["logprobs"] += [e.logprob for e in entries]
            seen["finish"] = choice.finish_reason or seen["finish"]
    return found, usage


def test_several_choices_streamed_equal_the_whole_answer(served: dict[str, Any]) -> None:
    fields = {"model": MODEL, "prompt": ["Once upon a time", "The weather today"], "n": 2, "max_tokens": 6,
              "temperature": 1.0, "seed": 11, "logprobs": 2}
    whole = client(served).completions.create(**fields)
    streamed, usage = streamed_choices(client(served).completions.create(
        **fields, stream=True, stream_options={"include_usage": True}))
    assert sorted(streamed) == [c.index for c in whole.choices] == [0, 1, 2, 3]
    for choice in whole.choices:
        assert choice.logprobs is not None
        assert streamed[choice.index]["text"] == choice.text
        assert streamed[choice.index]["tokens"] == choice.logprobs.tokens
        assert streamed[choice.index]["logprobs"] == pytest.approx(choice.logprobs.token_logprobs, abs=1e-5)
        assert streamed[choice.index]["finish"] == choice.finish_reason
    assert whole.choices[0].text != whole.choices[1].text
    assert usage == whole.usage


def test_several_chat_choices_streamed_equal_the_whole_answer(served: dict[str, Any]) -> None:
    fields = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "n": 3, "max_tokens": 5,
              "temperature": 1.0, "seed": 2, "logprobs": True, "top_logprobs": 1}
    whole = client(served).chat.completions.create(**fields)
    streamed, usage = streamed_choices(client(served).chat.completions.create(
        **fields, stream=True, stream_options={"include_usage": True}))
    assert sorted(streamed) == [0, 1, 2]
    for choice in whole.choices:
        assert choice.logprobs is not None and choice.logprobs.content is not None
        assert streamed[choice.index]["text"] == choice.message.content
        assert streamed[choice.index]["tokens"] == [e.token for e in choice.logprobs.content]
        assert streamed[choice.index]["finish"] == choice.finish_reason
    assert usage == whole.usage and usage.completion_tokens == sum(
        len(c.logprobs.content) for c in whole.choices if c.logprobs and c.logprobs.content)


def engine_counters(state: dict[str, Any]) -> dict[str, float]:
    """From Triton's /metrics: the CPU runtime's KV block counters (``reused``, ``missed``, ``tokens_per``) and the
    requests ``tensorrt_llm`` answered (``requests``)."""
    with urllib.request.urlopen(f"http://{state['metrics']}/metrics", timeout=5) as response:
        text = response.read().decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if family.name == "nv_trt_llm_kv_cache_block_metrics":
                found[sample.labels["kv_cache_block_type"]] = sample.value
            if family.name == "nv_inference_request_success" and sample.labels["model"] == "tensorrt_llm":
                found["requests"] = sample.value
    return found


def test_n_choices_are_one_engine_request_computing_the_prompt_once(served: dict[str, Any]) -> None:
    """The server's own counters: one ``tensorrt_llm`` request for the three choices, one prompt's blocks computed
    (missed in the cache) and the two other choices starting on them (reused)."""
    ids = [1, *random.Random(0).sample(range(3, 1000), 70)]  # a prompt served once: no cached prefix
    wait_idle(served, 30)
    before = engine_counters(served)
    answer = client(served).completions.create(model=MODEL, prompt=[ids], n=3, max_tokens=2, temperature=1.0,
                                               seed=1)
    assert len(answer.choices) == 3
    wait_idle(served, 30)
    time.sleep(1.0)  # the block counters are published after each engine step
    after = engine_counters(served)
    tokens_per = int(after["tokens_per"])
    assert after["requests"] - before.get("requests", 0) == 1
    assert after["missed"] - before["missed"] == (len(ids) - 1) // tokens_per  # the prompt computed once
    assert after["reused"] - before["reused"] == 2 * (len(ids) // tokens_per)  # and shared by the other choices


def test_best_of_returns_the_n_most_likely_and_counts_them_all(served: dict[str, Any]) -> None:
    fields = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 6, "temperature": 1.0, "seed": 4,
              "logprobs": 0, "extra_body": {"ignore_eos": True}}
    every = client(served).completions.create(**fields, n=3)
    best = client(served).completions.create(**fields, n=2, best_of=3)
    ranked = sorted(every.choices, key=lambda c: -sum(c.logprobs.token_logprobs))  # type: ignore[union-attr]
    assert [c.text for c in best.choices] == [c.text for c in ranked[:2]]
    assert [c.index for c in best.choices] == [0, 1]
    assert best.usage is not None and every.usage is not None and best.usage.completion_tokens == 18
    assert best.usage.prompt_tokens == every.usage.prompt_tokens


@pytest.mark.parametrize(("fields", "message"), [
    ({"n": 2, "best_of": 3, "stream": True}, "best_of (3) greater than n (2) cannot be streamed: the best are known "
                                             "only once all are done; send stream false, or best_of equal to n."),
    ({"n": 3, "best_of": 2}, "best_of must be an integer from n (3) to 16, got 2."),
])
def test_best_of_refusals_name_it(served: dict[str, Any], fields: dict[str, Any], message: str) -> None:
    status, _, body = post(f"http://{served['openai']}/v1/completions",
                           json.dumps({"model": MODEL, "prompt": "hi", **fields}).encode())
    assert status == 400 and json.loads(body)["error"]["message"] == message
    assert json.loads(body)["error"]["param"] == "best_of"


SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "size": {"enum": ["s", "m", "l"]}},
          "required": ["ok", "size"], "additionalProperties": False}


def test_json_schema_outputs_validate(served: dict[str, Any]) -> None:
    response_format = {"type": "json_schema", "json_schema": {"name": "item", "schema": SCHEMA, "strict": True}}
    answer = client(served).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "an item"}], max_tokens=60, temperature=1.0, seed=1, n=5,
        response_format=response_format)  # type: ignore[arg-type]
    assert len(answer.choices) == 5
    for choice in answer.choices:
        jsonschema.validate(json.loads(choice.message.content or ""), SCHEMA)


def test_guided_fields_of_vllm(served: dict[str, Any]) -> None:
    chosen = greedy(served, guided_choice=["red", "green", "blue"], max_tokens=10)
    assert chosen in ("red", "green", "blue")
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", greedy(served, guided_regex="[0-9]{3}-[a-z]{2}", max_tokens=12))
    jsonschema.validate(json.loads(greedy(served, guided_json=SCHEMA, max_tokens=60)), SCHEMA)
    assert isinstance(json.loads(greedy(served, response_format={"type": "json_object"}, max_tokens=200)), dict)


def test_two_guides_are_refused(served: dict[str, Any]) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        greedy(served, guided_regex="a+", guided_choice=["a"])
    assert isinstance(info.value.body, dict) and info.value.body["param"] == "guided_choice"


def with_frontend(config: OpenAIConfig, check: Callable[[str], None]) -> None:
    """An in-process frontend over a served build's Triton; ``check`` runs in a worker thread with its base URL."""
    async def main() -> None:
        port = free_port()
        runner = await start_frontend(OpenAIFrontend(config), "127.0.0.1", port)
        try:
            await asyncio.wait_for(asyncio.to_thread(check, f"http://127.0.0.1:{port}"), timeout=120)
        finally:
            await runner.cleanup()

    asyncio.run(main())


def test_an_engine_route_scores_the_prompt_from_context_logits(served32: dict[str, Any]) -> None:
    """Routes as the engine target makes them (``Route.context_logits``): built with ``[build] context_logits``, the
    prompt's logprobs are the frontend's log-softmax of the returned ``context_logits``, equal to the ones the CPU
    model computes; built without, echo with logprobs is a 400 naming the option."""
    out = served32["out"]
    common: dict[str, Any] = {"triton_model": "tensorrt_llm_bls", "tokenizer_dir": out / "tokenizer",
                              "models": ("tensorrt_llm_bls", "tensorrt_llm")}
    config = OpenAIConfig(grpc_url=served32["grpc"], served_name="with", routes=(
        Route("with", **common, context_logits=True), Route("without", **common, context_logits=False)))
    ids = AutoTokenizer.from_pretrained(builtin_dir("tiny-llama"))("The quick brown fox jumps").input_ids
    body = {"prompt": [ids], "max_tokens": 0, "logprobs": 2, "echo": True, "temperature": 0}
    scored = client(served32).completions.create(model=MODEL, **body).choices[0].logprobs
    assert scored is not None and scored.top_logprobs is not None

    def check(url: str) -> None:
        status, _, answer = post(f"{url}/v1/completions", json.dumps({"model": "with", **body}).encode())
        assert status == 200, answer
        logprobs = json.loads(answer)["choices"][0]["logprobs"]
        assert logprobs["tokens"] == scored.tokens and logprobs["token_logprobs"][0] is None
        assert logprobs["token_logprobs"][1:] == pytest.approx(scored.token_logprobs[1:], abs=1e-4)
        for mine, theirs in zip(logprobs["top_logprobs"][1:], scored.top_logprobs[1:], strict=True):
            assert list(mine) == list(theirs) and list(mine.values()) == pytest.approx(list(theirs.values()),
                                                                                       abs=1e-4)
        status, _, answer = post(f"{url}/v1/completions", json.dumps({"model": "without", **body}).encode())
        assert status == 400 and json.loads(answer)["error"]["param"] == "echo"
        assert "[build] context_logits = true (--context-logits)" in json.loads(answer)["error"]["message"]

    with_frontend(config, check)
