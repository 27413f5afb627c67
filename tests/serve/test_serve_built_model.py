"""The README's quick start: build the tiny Llama, serve it, and get the CPU runtime's own greedy decoding back
through every client: ``trtllm-kit generate``, tritonclient, the ``openai`` package (whole and streamed) and HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from typing import Any

import numpy as np
import openai
import pytest
import torch
import tritonclient.grpc as grpcclient
from kit_cli import KIT
from kit_server import BuildKey, Servers
from transformers import AutoTokenizer

from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.executor import Executor
from trtllm_kit.runtime.sequence import SamplingParams

pytestmark = [pytest.mark.integration, pytest.mark.slow]
PROMPT, MAX_TOKENS = "The capital of France is", 12
MODEL = "builtin:tiny-llama"


@pytest.fixture(scope="module")
def served(kit_servers: Servers) -> dict[str, Any]:
    torch.set_num_threads(1)
    server = kit_servers.get(BuildKey.of(), ensemble=True)  # one instance of each text model: fast start/stop
    return {**server.state, "out": server.out}


@pytest.fixture(scope="module")
def greedy(served: dict[str, Any]) -> tuple[list[int], list[int]]:
    """PROMPT's ids and the CPU runtime's greedy output ids for them (up to EOS, excluded)."""
    out = served["out"]
    tokenizer = AutoTokenizer.from_pretrained(str(out / "tokenizer"))
    prompt_ids = tokenizer(PROMPT).input_ids
    engine = Executor.from_checkpoint(out / "checkpoint", EngineConfig())
    ids = engine.generate([prompt_ids], [SamplingParams(max_tokens=MAX_TOKENS, end_id=tokenizer.eos_token_id)])[0]
    return prompt_ids, [t for t in ids if t != tokenizer.eos_token_id]


@pytest.fixture(scope="module")
def expected(served: dict[str, Any], greedy: tuple[list[int], list[int]]) -> tuple[list[str], int]:
    """The greedy tokens for PROMPT, each decoded as the streaming postprocessing does, and the prompt length."""
    tokenizer = AutoTokenizer.from_pretrained(str(served["out"] / "tokenizer"))
    return [tokenizer.decode([t], skip_special_tokens=True) for t in greedy[1]], len(greedy[0])


def stream_events(served: dict[str, Any], body: dict[str, Any]) -> list[dict[str, Any]]:
    request = urllib.request.Request(f"http://{served['openai']}/v1/completions",
                                     data=json.dumps({**body, "stream": True}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        events = [line[len("data: "):] for line in response.read().decode().split("\n\n") if line]
    assert events[-1] == "[DONE]"
    return [json.loads(event) for event in events[:-1]]


@pytest.mark.parametrize("sampling", [[], ["--temperature", "0", "--top-p", "0.9", "--seed", "1"]],
                         ids=["default", "temperature-0-with-top-p"])
def test_generate_cli(served: dict[str, Any], expected: tuple[list[str], int], sampling: list[str]) -> None:
    done = subprocess.run([*KIT, "generate", PROMPT, "--url", served["grpc"], "--max-tokens", str(MAX_TOKENS),
                           *sampling], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "".join(expected[0]) + "\n"  # temperature 0 is greedy, whatever top_p says


def test_tritonclient_stream(served: dict[str, Any], expected: tuple[list[str], int]) -> None:
    import queue

    events: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(served["grpc"]) as client:
        client.start_stream(callback=lambda result, error: events.put((result, error)))
        values = [("text_input", "BYTES", np.array([[PROMPT.encode()]], dtype=np.object_)),
                  ("max_tokens", "INT32", np.array([[MAX_TOKENS]], np.int32)), ("stream", "BOOL", np.array([[True]]))]
        inputs = []
        for name, datatype, array in values:
            inputs.append(grpcclient.InferInput(name, list(array.shape), datatype))
            inputs[-1].set_data_from_numpy(array)
        client.async_stream_infer("ensemble", inputs, enable_empty_final_response=True)
        pieces = []
        while True:
            result, error = events.get(timeout=60)
            assert error is None
            if result.as_numpy("text_output") is not None:
                pieces.append(result.as_numpy("text_output").reshape(-1)[0].decode())
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
        client.stop_stream()
    assert pieces == expected[0]


def test_openai_package_whole_and_streamed(served: dict[str, Any], expected: tuple[list[str], int]) -> None:
    client = openai.OpenAI(base_url=f"http://{served['openai']}/v1", api_key="unused", max_retries=0)
    done = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0)
    assert done.choices[0].text == "".join(expected[0])
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (expected[1], len(expected[0]))
    stream = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0, stream=True)
    assert "".join(chunk.choices[0].text for chunk in stream) == "".join(expected[0])


def test_plain_http(served: dict[str, Any], expected: tuple[list[str], int]) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0}
    request = urllib.request.Request(f"http://{served['openai']}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        assert json.loads(response.read())["choices"][0]["text"] == "".join(expected[0])
    assert os.path.isdir(served["out"] / "repo" / "tensorrt_llm_bls")


def test_token_id_prompts_stream_their_token_ids(served: dict[str, Any], greedy: tuple[list[int], list[int]]) -> None:
    prompt_ids, ids = greedy
    tokenizer = AutoTokenizer.from_pretrained(str(served["out"] / "tokenizer"))
    events = stream_events(served, {"model": MODEL, "prompt": prompt_ids, "max_tokens": MAX_TOKENS, "temperature": 0,
                                    "stream_options": {"include_usage": True}})
    choices = [event["choices"][0] for event in events if event["choices"]]
    assert [t for c in choices for t in c.get("token_ids", [])] == ids
    assert all(len(c["token_ids"]) == 1 for c in choices[:len(ids)])  # one event per token as it is generated
    assert "".join(c["text"] for c in choices) == tokenizer.decode(ids, skip_special_tokens=True)
    assert events[-1]["usage"] == {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids),
                                   "total_tokens": len(prompt_ids) + len(ids)}


@pytest.mark.parametrize("prompt", [PROMPT, "ids"])
def test_forced_output_length_is_accepted_on_both_paths(served: dict[str, Any], greedy: tuple[list[int], list[int]],
                                                           prompt: str) -> None:
    client = openai.OpenAI(base_url=f"http://{served['openai']}/v1", api_key="unused", max_retries=0)
    done = client.completions.create(model=MODEL, prompt=greedy[0] if prompt == "ids" else prompt, max_tokens=40,
                                     temperature=0, extra_body={"min_tokens": 40, "ignore_eos": True})
    assert (done.usage.completion_tokens, done.choices[0].finish_reason) == (40, "length")


def test_openai_text_prompts_skip_the_bls(served: dict[str, Any], expected: tuple[list[str], int]) -> None:
    """The frontend tokenizes text itself and streams from tensorrt_llm: the BLS sees none of its requests."""

    def successes(client: grpcclient.InferenceServerClient, model: str) -> int:
        stats = client.get_inference_statistics(model, as_json=True)["model_stats"]
        return sum(int(s["inference_stats"]["success"].get("count", 0)) for s in stats)

    client = openai.OpenAI(base_url=f"http://{served['openai']}/v1", api_key="unused", max_retries=0)
    with grpcclient.InferenceServerClient(served["grpc"]) as triton:
        before = {model: successes(triton, model) for model in ("tensorrt_llm_bls", "tensorrt_llm")}
        for stream in (False, True):
            done = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                                             stream=stream)
            text = "".join(c.choices[0].text for c in done) if stream else done.choices[0].text
            assert text == "".join(expected[0])
        after = {model: successes(triton, model) for model in ("tensorrt_llm_bls", "tensorrt_llm")}
    assert after["tensorrt_llm_bls"] == before["tensorrt_llm_bls"]
    assert after["tensorrt_llm"] == before["tensorrt_llm"] + 2
