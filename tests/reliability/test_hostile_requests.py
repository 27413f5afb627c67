"""Items 3, 5 and 7 of the hostile-client findings against real tritonservers, on the cpu and the llmapi target:
tiny temperatures and top_p, the largest seed, huge stop strings and oversized requests are answered (a 400 that
names the field, or a normal answer for the greedy case) while a neighbour's stream completes token for token,
and the server answers normally afterwards.

Before the fix: ``temperature`` 1e-45 (or ``top_p`` 1e-45, ``temperature`` 2 with ``top_p`` 1e-30, ``seed``
2**64 - 1) wedged the llmapi server until a restart and failed the whole step on the cpu target with a 500; two
120,000-character stop strings stalled every neighbour for 90 s; on llmapi ``max_tokens`` 2000 or 1e9 and prompts
beyond ``max_seq_len`` were 500s.
"""

from __future__ import annotations

import json
import queue
import threading
from typing import Any

import numpy as np
import openai
import pytest
from kit_server import TINY_BUILDS, Servers
from serving_helpers import MODEL, post
from tritonclient import grpc as grpcclient

from trtllm_kit.wire import GenerationRequest
from trtllm_kit.wire.llmapi import encode_llmapi_request
from trtllm_kit.wire.tensor import grpc_datatype

pytestmark = [pytest.mark.integration, pytest.mark.slow]
NEIGHBOUR = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 400, "temperature": 0,
             "ignore_eos": True}
HANG_GUARD_S = 180  # generous: a loaded CI machine is slow, a wedged server never answers


@pytest.fixture(scope="module", params=["cpu", "llmapi"])
def target(request: pytest.FixtureRequest, kit_servers: Servers) -> dict[str, Any]:
    """The session's serve of the tiny model built for the target (its requests leave the server as they found it,
    which is what they show); its state and the target's name."""
    server = kit_servers.get(TINY_BUILDS[request.param])
    return {**server.state, "target": request.param}


def completion(state: dict[str, Any], **fields: Any) -> tuple[int, dict[str, Any]]:
    """POST a completion of ``MODEL``; its status and JSON body."""
    status, _, body = post(f"http://{state['openai']}/v1/completions", json.dumps({
        "model": MODEL, "prompt": "Hello there", "max_tokens": 8, **fields}).encode())
    return status, json.loads(body)


class Neighbour(threading.Thread):
    """A greedy stream of 400 tokens through the official client; its text and finish reason once it ends."""

    def __init__(self, state: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.client = openai.OpenAI(base_url=f"http://{state['openai']}/v1", api_key="none", max_retries=0,
                                    timeout=HANG_GUARD_S)
        self.started_streaming = threading.Event()
        self.pieces: list[str] = []
        self.finish_reason: str | None = None
        self.failure: BaseException | None = None

    def run(self) -> None:
        body = {k: v for k, v in NEIGHBOUR.items() if k != "ignore_eos"}
        try:
            for chunk in self.client.completions.create(**body, stream=True, extra_body={"ignore_eos": True}):
                self.pieces.append(chunk.choices[0].text)
                self.finish_reason = chunk.choices[0].finish_reason or self.finish_reason
                self.started_streaming.set()
        except BaseException as exc:  # reported by the test thread
            self.failure = exc
        finally:
            self.started_streaming.set()

    def result(self) -> tuple[str, str | None]:
        self.join(HANG_GUARD_S)
        assert not self.is_alive(), "the neighbour's stream never ended"
        assert self.failure is None, self.failure
        return "".join(self.pieces), self.finish_reason


def alone(state: dict[str, Any]) -> str:
    """The neighbour's text when it runs by itself (greedy: the same every time)."""
    status, body = completion(state, **NEIGHBOUR)
    assert status == 200, body
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 400
    return body["choices"][0]["text"]


def run_beside_a_neighbour(state: dict[str, Any], hostile: list[dict[str, Any]]) -> list[tuple[int, dict]]:
    """Send each hostile body while a neighbour streams; the answers, after checking the neighbour's text."""
    expected = alone(state)
    neighbour = Neighbour(state)
    neighbour.start()
    assert neighbour.started_streaming.wait(HANG_GUARD_S)
    answers = [completion(state, **fields) for fields in hostile]
    text, reason = neighbour.result()
    assert (text, reason) == (expected, "length")
    assert completion(state)[0] == 200  # and the server goes on answering
    return answers


def test_tiny_sampling_values_and_the_largest_seed_are_answered(target: dict[str, Any]) -> None:
    status, greedy = completion(target, temperature=0)
    assert status == 200, greedy
    answers = run_beside_a_neighbour(target, [
        {"temperature": 1e-45}, {"top_p": 1e-45}, {"temperature": 2, "top_p": 1e-30}, {"seed": 2**64 - 1},
        {"temperature": 1e-45, "seed": 2**64 - 1}, {"top_p": 0}, {"seed": 2**64}, {"temperature": -1e-45}])
    statuses = [status for status, _ in answers]
    assert statuses == [200, 200, 200, 200, 200, 400, 400, 400], answers
    # below 1e-5 the temperature is greedy; top_p 1e-45 keeps only the most likely token, which is greedy too
    assert answers[0][1]["choices"][0]["text"] == greedy["choices"][0]["text"]
    assert answers[1][1]["choices"][0]["text"] == greedy["choices"][0]["text"]
    assert answers[3][1]["usage"]["completion_tokens"] > 0
    assert [body["error"]["param"] for _, body in answers[5:]] == ["top_p", "seed", "temperature"]


def test_huge_stop_strings_are_refused_while_a_neighbour_streams(target: dict[str, Any]) -> None:
    answers = run_beside_a_neighbour(target, [
        {"stop": ["x" * 120_000, "y" * 120_000]}, {"stop": ["z"] * 65}, {"stop": ["w" * 1000] * 17}])
    assert [status for status, _ in answers] == [400, 400, 400]
    assert [body["error"]["message"] for _, body in answers] == [
        "a stop sequence has 120000 characters; at most 1000 are allowed in each ('xxxxxxxxxxxxxxxxxxxx'...).",
        "stop holds 65 sequences; at most 64 are allowed.",
        "the stop sequences have 17000 characters together; at most 16384 are allowed."]
    status, body = completion(target, stop=["q" * 1000] * 16, temperature=0)  # at the bounds: served
    assert status == 200, body


@pytest.mark.parametrize(("fields", "message"), [
    ({"max_tokens": 2000}, "max_tokens must be at most 1023 (this model's max_seq_len is 1024 tokens), got 2000."),
    ({"max_tokens": 10**9}, "max_tokens must be at most 1023 (this model's max_seq_len is 1024 tokens), got "
                            "1000000000."),
    ({"prompt": [7] * 1100}, "this model's maximum context length is 1024 tokens; the request asks for 1100 prompt "
                             "+ 8 completion tokens: shorten the prompt or lower max_tokens."),
    ({"n": 17}, "n must be an integer from 1 to 16, got 17."),
    ({"prompt": ["a"] * 65}, "prompt is a list of 65 prompts; at most 64 are allowed per request: split it."),
])
def test_client_errors_are_400_on_every_target(target: dict[str, Any], fields: dict[str, Any], message: str) -> None:
    status, body = completion(target, **fields)
    assert (status, body["error"]["message"]) == (400, message)


def test_deep_json_and_an_oversized_body_are_refused(target: dict[str, Any]) -> None:
    url = f"http://{target['openai']}/v1/completions"
    deep = b'{"model": "builtin:tiny-llama", "prompt": "hi", "metadata": ' + b"[" * 40 + b"]" * 40 + b"}"
    status, _, body = post(url, deep)
    assert (status, json.loads(body)["error"]["message"]) == (
        400, "the request body nests JSON deeper than 32 levels; flatten it.")
    status, _, body = post(url, json.dumps({"model": MODEL, "prompt": "a" * (5 * 2**20)}).encode())
    assert (status, json.loads(body)["error"]["message"]) == (
        413, "the request body is larger than this server's limit of 4194304 bytes; send a shorter prompt.")


def llmapi_values(prompt: str | list[int], max_tokens: int, **sampling: Any) -> dict[str, np.ndarray]:
    """The llmapi model's tensors of a streamed request, as the kit's clients send them."""
    return encode_llmapi_request(GenerationRequest(prompt, max_tokens, streaming=True, return_finish_reason=True,
                                                   **sampling))


def direct(state: dict[str, Any], values: dict[str, np.ndarray]) -> str:
    """One streamed request straight to Triton's ``tensorrt_llm`` model: ``ok`` or the error's message."""
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(state["grpc"])
    inputs = []
    for name, array in values.items():
        tensor = grpcclient.InferInput(name, list(array.shape), grpc_datatype(array))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer("tensorrt_llm", inputs, enable_empty_final_response=True)
        for _ in range(64):  # bounded: one response per token at most, plus the final one
            result, error = results.get(timeout=HANG_GUARD_S)
            if error is not None:
                return str(error)
            if result.get_response().parameters["triton_final_response"].bool_param:
                return "ok"
        raise AssertionError("no final response")
    finally:
        client.stop_stream()
        client.close()


def test_the_llmapi_model_checks_sampling_values_itself(target: dict[str, Any]) -> None:
    """Triton's own port reaches the model without the frontend: it refuses or makes greedy on its own."""
    if target["target"] != "llmapi":
        pytest.skip("the llmapi model's own inputs")
    assert direct(target, llmapi_values("Hello", 8, temperature=1e-45)) == "ok"
    assert direct(target, llmapi_values("Hello", 8, temperature=2.0, top_p=1e-30, seed=2**64 - 1)) == "ok"
    assert "top_p must be in (0, 1], got 0.0" in direct(target, llmapi_values("Hello", 8, top_p=0.0))
    refused = direct(target, llmapi_values(list(range(5, 1000)) * 2, 8))
    assert "more than max_seq_len 1024" in refused, refused
    assert direct(target, llmapi_values("Hello", 8)) == "ok"
