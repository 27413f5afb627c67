"""The kit's clients over the llmapi repository on a real tritonserver (``trtllm-kit serve``, CPU runtime behind
the LLM interface): ``generate``, the OpenAI frontend (text and token ids, streamed and whole, usage), a
cancelled stream freeing its KV blocks, the nv_trt_llm_* gauges moving with load, and ``bench`` over gRPC and
OpenAI with exact token counts."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch
from kit_cli import KIT
from kit_server import TINY_BUILDS, Servers
from prometheus_client.parser import text_string_to_metric_families
from transformers import AutoTokenizer

from trtllm_kit.cli import run
from trtllm_kit.llmapi.load import load_unified
from trtllm_kit.profile.records import read_records
from trtllm_kit.profile.report import read_summary
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.executor import Executor
from trtllm_kit.runtime.sequence import SamplingParams
from trtllm_kit.serve.client import TextClient
from trtllm_kit.wire import GenerationRequest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
PROMPT, MAX_TOKENS = "The capital of France is", 8
GREEDY = {"model": "builtin:tiny-llama", "temperature": 0}  # the served name; OpenAI's default samples


@pytest.fixture(scope="module")
def served(kit_servers: Servers) -> dict[str, Any]:
    torch.set_num_threads(1)
    server = kit_servers.get(TINY_BUILDS["llmapi"])
    return {**server.state, "out": server.out}


@pytest.fixture(scope="module")
def greedy(served: dict[str, Any]) -> tuple[list[int], list[int]]:
    ckpt = served["out"] / "checkpoint"
    tokenizer = AutoTokenizer.from_pretrained(str(ckpt))
    ids = tokenizer.encode(PROMPT)
    out = Executor(load_unified(ckpt), EngineConfig()).generate(
        [ids], [SamplingParams(max_tokens=MAX_TOKENS, end_id=tokenizer.eos_token_id)])[0]
    return ids, [t for t in out if t != tokenizer.eos_token_id]


def post(served: dict[str, Any], body: dict[str, Any]) -> Any:
    request = urllib.request.Request(f"http://{served['openai']}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(request, timeout=60)


def gauges(served: dict[str, Any], family: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{served['metrics']}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {s.labels[next(k for k in s.labels if k not in ("model", "version"))]: s.value
            for f in text_string_to_metric_families(text) if f.name == family for s in f.samples}


def test_generate_cli(served: dict[str, Any], greedy: tuple[list[int], list[int]]) -> None:
    done = subprocess.run([*KIT, "generate", PROMPT, "--url", served["grpc"], "--max-tokens", str(MAX_TOKENS)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    tokenizer = AutoTokenizer.from_pretrained(str(served["out"] / "checkpoint"))
    assert done.stdout.rstrip("\n") == tokenizer.decode(greedy[1], skip_special_tokens=True)


def test_openai_text_whole_with_usage(served: dict[str, Any], greedy: tuple[list[int], list[int]]) -> None:
    with post(served, {**GREEDY, "prompt": PROMPT, "max_tokens": MAX_TOKENS}) as response:
        body = json.loads(response.read())
    tokenizer = AutoTokenizer.from_pretrained(str(served["out"] / "checkpoint"))
    assert body["choices"][0]["text"] == tokenizer.decode(greedy[1], skip_special_tokens=True)
    assert body["usage"] == {"prompt_tokens": len(greedy[0]), "completion_tokens": len(greedy[1]),
                             "total_tokens": len(greedy[0]) + len(greedy[1])}


def test_openai_token_ids_streamed(served: dict[str, Any], greedy: tuple[list[int], list[int]]) -> None:
    body = {**GREEDY, "prompt": greedy[0], "max_tokens": MAX_TOKENS, "stream": True,
            "stream_options": {"include_usage": True}}
    with post(served, body) as response:
        events = [e[len("data: "):] for e in response.read().decode().split("\n\n") if e]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    ids = [t for c in chunks for choice in c["choices"] for t in choice.get("token_ids") or []]
    assert ids == greedy[1]
    assert chunks[-1]["usage"]["completion_tokens"] == len(greedy[1])
    assert chunks[-1]["usage"]["prompt_tokens"] == len(greedy[0])


def test_a_cancelled_stream_frees_its_kv_blocks(served: dict[str, Any]) -> None:
    idle = gauges(served, "nv_trt_llm_kv_cache_block_metrics")
    body = {**GREEDY, "prompt": PROMPT * 8, "max_tokens": 400, "ignore_eos": True, "stream": True}
    response = post(served, body)
    for _ in range(3):  # a few tokens in: the request holds blocks
        response.readline()
    busy = None
    for _ in range(50):  # bounded: the gauges are published twice a second
        seen = gauges(served, "nv_trt_llm_kv_cache_block_metrics")
        if seen["used"] > idle["used"]:
            busy = seen
            break
        time.sleep(0.1)
    assert busy is not None and busy["free"] < idle["free"]
    assert gauges(served, "nv_trt_llm_request_metrics")["active"] >= 1
    response.close()  # the client goes away: the frontend cancels, the model aborts, the blocks come back
    for _ in range(100):
        blocks = gauges(served, "nv_trt_llm_kv_cache_block_metrics")
        if blocks["used"] == 0 and gauges(served, "nv_trt_llm_request_metrics")["active"] == 0:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"blocks still held after the stream was cancelled: {blocks}")
    assert blocks["free"] == blocks["max"]


def bench(out: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[dict, list]:
    code = run(["bench", *args, "--isl", "16", "--no-plots", "--max-client-lag", "1000", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    return read_summary(out)["runs"][0], read_records(out / "requests.jsonl")


def test_bench_over_grpc(served: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_, records = bench(tmp_path / "res", capsys, "--url", f"grpc://{served['grpc']}", "--model", "tensorrt_llm",
                          "--concurrency", "3", "--requests", "6", "--osl", "8", "--vocab-size", "1000",
                          "--warmup", "1")
    assert run_["num_ok"] == 6 and run_["length_mismatches"] == 0 and run_["server_count_mismatches"] == 0
    assert all(r.osl_observed == 8 == r.osl_server for r in records)


@pytest.mark.parametrize("text", [False, True])
def test_bench_over_openai(served: dict[str, Any], text: bool, tmp_path: Path,
                           capsys: pytest.CaptureFixture[str]) -> None:
    extra = ["--tokenizer", str(served["out"] / "tokenizer")] if text else []
    run_, records = bench(tmp_path / "res", capsys, "--openai-url", f"http://{served['openai']}/v1", *extra,
                          "--concurrency", "2", "--requests", "4", "--osl", "8", "--vocab-size", "1000",
                          "--warmup", "1")
    assert run_["num_ok"] == 4 and run_["length_mismatches"] == 0 and run_["server_count_mismatches"] == 0
    assert all(r.osl_server == 8 and r.server["prompt_tokens"] == 16 for r in records)


def test_openai_logprobs_and_echo_equal_the_runtimes(served: dict[str, Any]) -> None:
    """Completions logprobs with echo (lm-eval's loglikelihood shape) through the llmapi model's
    ``sampling_param_logprobs`` / ``sampling_param_prompt_logprobs``, equal to the CPU runtime's own numbers."""
    ids = AutoTokenizer.from_pretrained(str(served["out"] / "checkpoint")).encode(PROMPT)
    with post(served, {**GREEDY, "prompt": [ids], "max_tokens": 4, "logprobs": 2, "echo": True,
                       "ignore_eos": True}) as response:
        logprobs = json.loads(response.read())["choices"][0]["logprobs"]
    engine = Executor(load_unified(served["out"] / "checkpoint"), EngineConfig())
    seq = engine.add_request(ids, SamplingParams(max_tokens=4, temperature=0.0, logprobs=2, prompt_logprobs=2))
    while engine.has_work():
        engine.step()
    expected = [e.logprob for e in seq.prompt_logprobs[1:]] + [e.logprob for e in seq.output_logprobs]
    assert len(logprobs["tokens"]) == len(ids) + 4 and logprobs["token_logprobs"][0] is None
    assert logprobs["token_logprobs"][1:] == pytest.approx(expected, abs=1e-4)
    # the 2 best and the token itself when it is another (OpenAI's k + 1); tokens that decode alike share a key
    assert all(1 <= len(top) <= 3 for top in logprobs["top_logprobs"][1:])


def test_openai_keeps_a_generated_end_token(served: dict[str, Any]) -> None:
    """lm-eval's request for a continuation the model ends after (echo, logprobs, max_tokens 1): the end token comes
    back through the llmapi model's ``keep_end_token``, scored as the runtime scores it and counted."""
    ids = [1, 38, 562, 603, 287, 498, 267, 422, 346, 266, 641, 651, 285, 769, 302, 447, 333, 734]
    eos = AutoTokenizer.from_pretrained(str(served["out"] / "checkpoint")).eos_token_id
    engine = Executor(load_unified(served["out"] / "checkpoint"), EngineConfig())
    seq = engine.add_request(ids, SamplingParams(max_tokens=1, temperature=0.0, logprobs=1, end_id=eos,
                                                 keep_end_token=True))
    while engine.has_work():
        engine.step()
    assert seq.output_ids == [eos], "the model ends after this prompt"
    with post(served, {**GREEDY, "prompt": [ids], "max_tokens": 1, "logprobs": 1, "echo": True}) as response:
        answer = json.loads(response.read())
    choice = answer["choices"][0]
    assert len(choice["logprobs"]["token_logprobs"]) == len(ids) + 1 and answer["usage"]["completion_tokens"] == 1
    assert choice["finish_reason"] == "stop" and "</s>" not in choice["text"]
    assert choice["logprobs"]["token_logprobs"][-1] == pytest.approx(seq.output_logprobs[0].logprob, abs=1e-4)


def test_openai_n_choices_streamed_with_chat_logprobs(served: dict[str, Any]) -> None:
    body = {"model": "builtin:tiny-llama", "messages": [{"role": "user", "content": "hi"}], "n": 2,
            "max_tokens": 4, "temperature": 1.0, "seed": 5, "logprobs": True, "top_logprobs": 1, "ignore_eos": True}
    request = urllib.request.Request(f"http://{served['openai']}/v1/chat/completions",
                                     data=json.dumps({**body, "stream": True}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        events = [e[len("data: "):] for e in response.read().decode().split("\n\n") if e]
    assert events[-1] == "[DONE]"
    streamed: dict[int, list[str]] = {}
    for chunk in map(json.loads, events[:-1]):
        for choice in chunk["choices"]:
            entries = (choice["logprobs"] or {}).get("content") or []
            streamed.setdefault(choice["index"], []).extend(entry["token"] for entry in entries)
    request = urllib.request.Request(f"http://{served['openai']}/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        whole = json.loads(response.read())["choices"]
    assert streamed == {c["index"]: [e["token"] for e in c["logprobs"]["content"]] for c in whole}
    assert len(streamed[0]) == len(streamed[1]) == 4


def test_openai_best_of_is_picked_by_the_llmapi_model(served: dict[str, Any]) -> None:
    body = {"model": "builtin:tiny-llama", "prompt": PROMPT, "n": 2, "best_of": 3, "max_tokens": 4,
            "temperature": 1.0, "seed": 3, "ignore_eos": True, "logprobs": 0}
    with post(served, body) as response:
        answer = json.loads(response.read())
    assert [c["index"] for c in answer["choices"]] == [0, 1]
    sums = [sum(c["logprobs"]["token_logprobs"]) for c in answer["choices"]]
    assert sums == sorted(sums, reverse=True)  # best first
    assert answer["usage"]["completion_tokens"] == 8  # the LLM API returns the two it keeps


def test_stop_strings_reach_the_llmapi_model_and_cut_the_text(served: dict[str, Any],
                                                              greedy: tuple[list[int], list[int]]) -> None:
    """Stop strings go to the engine as ``SamplingParams.stop`` (kept in its output, so that the frontend cuts the
    text as the request asks), and the answer ends at the first one, with or without it."""
    tokenizer = AutoTokenizer.from_pretrained(str(served["out"] / "checkpoint"))
    text = tokenizer.decode(greedy[1], skip_special_tokens=True)
    stop = text[len(text) // 2:len(text) // 2 + 2]
    stops = [stop, "never appears", "nor this", "nor that", "nor these five"]

    async def tensors() -> dict[str, Any]:
        client = TextClient(served["grpc"], "tensorrt_llm")
        try:
            request = await client._request(GenerationRequest(PROMPT, MAX_TOKENS, stop_strings=tuple(stops)))
        finally:
            await client.close()
        return {t.name: raw for t, raw in zip(request.inputs, request.raw_input_contents, strict=True)}

    sent = asyncio.run(tensors())
    assert all(s.encode() in sent["sampling_param_stop"] for s in stops)
    assert sent["sampling_param_include_stop_str_in_output"] == b"\x01"
    for include in (False, True):
        body = {**GREEDY, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "stop": stops,
                "include_stop_str_in_output": include}
        with post(served, body) as response:
            choice = json.loads(response.read())["choices"][0]
        cut = text.index(stop) + (len(stop) if include else 0)
        assert choice["text"] == text[:cut] and choice["finish_reason"] == "stop", (choice, text, stop)
