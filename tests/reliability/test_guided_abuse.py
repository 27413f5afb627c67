"""Items 1 and 7 of the structured-output findings against real tritonservers, on the cpu and the llmapi target:
hostile guides are a 400 naming the field that carried them, an oversized guide is refused before it compiles (by
the frontend, and by the model for a client of Triton's own port), and a guide that takes minutes to compile is
refused at the compile-time bound while neighbours, and another guided request, are answered.

Before the fix: ``guided_grammar: "root ::= nothere"``, a self-referencing ``$ref``, a regex nested 2,000 deep, EBNF
nested 3,000 deep were 500s, ``guided_json`` as a string nested 1,000 deep a RecursionError (500); a guide was
compiled inside the model's request loop (the llmapi model's event loop), so a slow one stopped every neighbour
until it compiled, and a 100,000-string enum compiled for minutes.
"""

from __future__ import annotations

import json
import queue
import threading
from typing import Any

import numpy as np
import pytest
from kit_server import TINY_BUILDS, Servers
from serving_helpers import MODEL, post
from tritonclient import grpc as grpcclient

pytestmark = [pytest.mark.integration, pytest.mark.slow]
HANG_GUARD_S = 180  # generous: a loaded machine is slow, a stalled server never answers
# An object of 3,000 optional properties: 29 kB, within the bounds, and minutes of compiling for xgrammar.
SLOW = json.dumps({"type": "object", "properties": {str(i): {} for i in range(3000)}}, separators=(",", ":"))
SLOW_FIELDS = {"response_format": {"type": "json_schema", "json_schema": {"name": "slow", "schema": json.loads(SLOW)}}}
HUGE = json.dumps({"enum": [f"value-{i:06d}-xyz" for i in range(100_000)]})  # 1.9 MB, under the body bound
HOSTILE = {
    "undefined-rule": ({"guided_grammar": "root ::= nothere"}, "guided_grammar",
                       'guided_grammar cannot be compiled: EBNF parser error at line 1, column 10: Rule "nothere" is '
                       "not defined; fix the guide."),
    "self-ref": ({"guided_json": {"$ref": "#"}}, "guided_json",
                 "guided_json cannot be compiled: Circular $ref chain with no schema content: # -> #; fix the guide."),
    "regex-2000-deep": ({"guided_regex": "(" * 2000 + "a" + ")" * 2000}, "guided_regex",
                        "guided_regex nests 2000 levels deep; a structured-output guide may nest at most 32: "
                        "flatten it."),
    "ebnf-3000-deep": ({"guided_grammar": "root ::= " + "(" * 3000 + '"a"' + ")" * 3000}, "guided_grammar",
                       "guided_grammar nests 3000 levels deep; a structured-output guide may nest at most 32: "
                       "flatten it."),
    "json-string-1000-deep": ({"guided_json": '{"type": "array", "items": ' * 999 + "{}" + "}" * 999}, "guided_json",
                              "guided_json nests 1000 levels deep; a structured-output guide may nest at most 32: "
                              "flatten it."),
}


PROMPT = [1, 415, 565, 37]


@pytest.fixture(scope="module", params=["cpu", "llmapi"])
def target(request: pytest.FixtureRequest, kit_servers: Servers) -> dict[str, Any]:
    """The session's serve of the tiny model built for the target (its requests leave the server as they found it,
    which is what they show); its state and the target's name."""
    server = kit_servers.get(TINY_BUILDS[request.param])
    return {**server.state, "target": request.param}


def completion(state: dict[str, Any], **fields: Any) -> tuple[int, dict[str, Any]]:
    """POST a completion of ``MODEL`` (greedy, 4 tokens unless ``fields`` say otherwise); its status and body."""
    status, _, body = post(f"http://{state['openai']}/v1/completions", json.dumps({
        "model": MODEL, "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0, **fields}).encode())
    return status, json.loads(body)


def straight_to_triton(state: dict[str, Any], guide_type: str, guide: str) -> str:
    """A guided request of four tokens sent to Triton's ``tensorrt_llm`` model itself, past the frontend (the cpu
    target's batched tensors, or the llmapi model's); its error's message, or ``answered``."""
    batched = state["target"] == "cpu"
    arrays = {"input_ids": np.array(PROMPT, np.int32), "guided_decoding_guide_type": np.array([guide_type], object),
              "guided_decoding_guide": np.array([guide], object)}
    arrays.update({"input_lengths": np.array([len(PROMPT)], np.int32), "request_output_len": np.array([4], np.int32)}
                  if batched else {"sampling_param_max_tokens": np.array([4], np.int32)})
    inputs = []
    for name, array in arrays.items():
        array = array[None] if batched else array
        inputs.append(grpcclient.InferInput(name, list(array.shape), "BYTES" if array.dtype == object else "INT32"))
        inputs[-1].set_data_from_numpy(array)
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(state["grpc"])
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("tensorrt_llm", inputs, enable_empty_final_response=True)
        while True:
            result, error = answers.get(timeout=HANG_GUARD_S)
            if error is not None:
                return str(error)
            if result.get_response().parameters["triton_final_response"].bool_param:
                return "answered"
    finally:
        client.stop_stream()
        client.close()


class Guided(threading.Thread):
    """A completion with structured-output fields, sent in a thread of its own; its status and body once done."""

    def __init__(self, state: dict[str, Any], fields: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.state, self.fields = state, fields
        self.answer: tuple[int, dict[str, Any]] | None = None

    def run(self) -> None:
        self.answer = completion(self.state, **self.fields)

    def result(self) -> tuple[int, dict[str, Any]]:
        self.join(HANG_GUARD_S)
        assert self.answer is not None, "the guided request was never answered"
        return self.answer


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_guide_is_a_400_naming_its_field(target: dict[str, Any], case: str) -> None:
    fields, param, message = HOSTILE[case]
    status, body = completion(target, **fields)
    assert status == 400, body
    assert body["error"] == {"message": message, "type": "invalid_request_error", "param": param, "code": None}


def test_an_oversized_guide_is_refused_before_it_compiles(target: dict[str, Any]) -> None:
    status, body = completion(target, guided_json=json.loads(HUGE))
    assert (status, body["error"]["param"]) == (400, "guided_json"), body
    assert body["error"]["message"] == ("guided_json has 2000010 characters; a structured-output guide may have at "
                                        "most 65536: send a smaller one.")

    assert ("guided_decoding_guide (json_schema) has 2000010 characters; a structured-output guide may have at most "
            "65536: send a smaller one.") in straight_to_triton(target, "json_schema", HUGE)

def test_a_slow_guide_delays_only_its_own_request(target: dict[str, Any]) -> None:
    slow = Guided(target, SLOW_FIELDS)
    slow.start()
    quick = Guided(target, {"guided_choice": ["red", "green", "blue"], "max_tokens": 8})
    quick.start()
    answered = []
    for seed in range(3):  # neighbours, one after another, while the slow guide compiles
        answered.append((completion(target, seed=seed, temperature=1.0)[0], slow.is_alive()))
    status, body = quick.result()
    assert (status, body["choices"][0]["text"] in ("red", "green", "blue")) == (200, True), body
    assert slow.is_alive(), "the slow guide was answered before the other guided request"
    assert answered == [(200, True)] * 3  # each neighbour answered while the slow guide still compiled
    status, body = slow.result()
    assert status == 400 and body["error"] == {
        "message": "response_format did not compile within 10 s, the bound on a guide's compile time: send a simpler "
                   "guide.", "type": "invalid_request_error", "param": "response_format", "code": None}, body
    assert completion(target)[0] == 200  # and the server goes on answering
