"""The CPU ``tensorrt_llm`` model of a built ``cpu`` repository on a real tritonserver: logprobs (generated with
alternatives, prompt, cumulative), context logits, ``num_return_sequences`` with ``sequence_index``, the penalties
and guided decoding with the repository's xgrammar tokenizer info, each equal to the runtime run in-process."""

from __future__ import annotations

import json
import queue
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient

from tests.integration.tritonserver import running_server
from trtllm_kit.build.pipeline import run_build
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.executor import Executor
from trtllm_kit.runtime.model import CheckpointModel
from trtllm_kit.runtime.sequence import SamplingParams
from trtllm_kit.spec import BuildSpec

pytestmark = pytest.mark.integration
PROMPT = [1, 415, 565, 37, 902, 11, 260, 733, 5]
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "size": {"enum": ["s", "m", "l"]}},
          "required": ["ok", "size"], "additionalProperties": False}
DTYPES = {np.int32: "INT32", np.bool_: "BOOL", np.float32: "FP32", np.object_: "BYTES"}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("eval")
    out = root / "out"
    run_build(BuildSpec.from_dict({"model": "builtin:tiny-llama", "out": out, "build": {"verify": False}, "repo": {
        "preprocessing_instances": 1, "postprocessing_instances": 1, "bls_instances": 1}}))
    with running_server(out / "repo", root) as server:
        client = grpcclient.InferenceServerClient(server.config.endpoints.url("grpc"))
        try:
            yield client, out
        finally:
            client.close()


def run(client, values: dict[str, object], timeout_s: float = 60.0) -> list[dict[str, np.ndarray]]:
    """One streamed request to ``tensorrt_llm``; its responses' outputs, in order. An error fails with its text."""
    arrays = {"input_ids": np.array([PROMPT], np.int32), "input_lengths": np.array([[len(PROMPT)]], np.int32),
              "streaming": np.array([[False]], bool), "exclude_input_in_output": np.array([[True]], bool)}
    for name, value in values.items():
        arrays[name] = np.array([[value]], np.object_ if isinstance(value, str) else
                                bool if isinstance(value, bool) else np.int32 if isinstance(value, int)
                                else np.float32)
    inputs = []
    for name, array in arrays.items():
        inputs.append(grpcclient.InferInput(name, list(array.shape), DTYPES[array.dtype.type]))
        inputs[-1].set_data_from_numpy(array)
    events: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: events.put((result, error)))
    try:
        client.async_stream_infer("tensorrt_llm", inputs, enable_empty_final_response=True)
        responses = []
        while True:
            result, error = events.get(timeout=timeout_s)
            if error is not None:
                raise RuntimeError(str(error))
            response = result.get_response()
            if response.outputs:
                responses.append({o.name: result.as_numpy(o.name) for o in response.outputs})
            if response.parameters["triton_final_response"].bool_param:
                return responses
    finally:
        client.stop_stream()


def local(out: Path, params: SamplingParams):
    engine = Executor(CheckpointModel.load(out / "checkpoint"), EngineConfig())
    first = engine.add_request(PROMPT, params)
    while engine.has_work():
        engine.step()
    return first


def test_logprobs_and_context_logits_equal_the_runtime(served):
    client, out = served
    [response] = run(client, {"request_output_len": 5, "runtime_top_k": 1, "return_log_probs": True,
                              "num_top_log_probs": 3, "return_prompt_log_probs": True,
                              "return_context_logits": True})
    seq = local(out, SamplingParams(max_tokens=5, top_k=1, logprobs=3, prompt_logprobs=3))
    assert response["output_ids"].reshape(-1).tolist() == seq.output_ids
    assert response["output_log_probs"].shape == (1, 1, 5)
    assert response["output_log_probs"].reshape(-1) == pytest.approx([e.logprob for e in seq.output_logprobs],
                                                                     abs=1e-5)
    assert response["cum_log_probs"].reshape(-1) == pytest.approx([seq.cum_logprob], abs=1e-4)
    assert response["top_log_prob_ids"].shape == (1, 1, 5, 3)
    assert response["top_log_prob_ids"][0, 0].tolist() == [list(e.top_ids) for e in seq.output_logprobs]
    prompt = response["prompt_log_probs"].reshape(-1)
    assert prompt[0] == 0.0 and len(prompt) == len(PROMPT)
    assert prompt[1:] == pytest.approx([e.logprob for e in seq.prompt_logprobs[1:]], abs=1e-5)
    assert response["prompt_top_log_prob_ids"][0, 0].tolist() == [-1, -1, -1]
    context = torch.log_softmax(torch.tensor(response["context_logits"][0]), dim=-1)
    assert context.shape[0] == len(PROMPT)
    scored = [float(context[i, PROMPT[i + 1]]) for i in range(len(PROMPT) - 1)]
    assert scored == pytest.approx(prompt[1:].tolist(), abs=1e-5)


def test_num_return_sequences_give_indexed_responses(served):
    client, out = served
    values = {"request_output_len": 6, "temperature": 1.0, "runtime_top_p": 1.0, "num_return_sequences": 3}
    first, again = run(client, values), run(client, values)
    by_index = {int(r["sequence_index"].reshape(-1)[0]): r["output_ids"].reshape(-1).tolist() for r in first}
    assert sorted(by_index) == [0, 1, 2]
    assert by_index == {int(r["sequence_index"].reshape(-1)[0]): r["output_ids"].reshape(-1).tolist() for r in again}
    group = local(out, SamplingParams(max_tokens=6, temperature=1.0, top_p=1.0, n=3)).group
    assert by_index == {seq.index: seq.output_ids for seq in group}


def test_streamed_sequences_carry_their_index_and_logprobs(served):
    client, _ = served
    values = {"request_output_len": 6, "temperature": 1.0, "runtime_top_p": 1.0, "num_return_sequences": 2,
              "return_log_probs": True, "num_top_log_probs": 2}
    whole = {int(r["sequence_index"].reshape(-1)[0]): r for r in run(client, values)}
    tokens: dict[int, list[int]] = {0: [], 1: []}
    logprobs: dict[int, list[float]] = {0: [], 1: []}
    for response in run(client, {**values, "streaming": True}):
        index = int(response["sequence_index"].reshape(-1)[0])
        tokens[index] += response["output_ids"].reshape(-1).tolist()
        logprobs[index] += response["output_log_probs"].reshape(-1).tolist()
        assert response["top_log_probs"].shape[2] == response["output_ids"].shape[2]
    for index, response in whole.items():
        assert tokens[index] == response["output_ids"].reshape(-1).tolist()
        assert logprobs[index] == pytest.approx(response["output_log_probs"].reshape(-1).tolist(), abs=1e-6)


def test_penalties_and_min_p_reach_the_runtime(served):
    client, out = served
    values = {"request_output_len": 8, "temperature": 0.8, "runtime_top_p": 1.0, "runtime_min_p": 0.05,
              "repetition_penalty": 1.3, "presence_penalty": 0.5, "frequency_penalty": 0.25, "min_tokens": 8}
    [response] = run(client, values)
    seq = local(out, SamplingParams(max_tokens=8, temperature=0.8, top_p=1.0, min_p=0.05, repetition_penalty=1.3,
                                    presence_penalty=0.5, frequency_penalty=0.25, min_tokens=8))
    assert response["output_ids"].reshape(-1).tolist() == seq.output_ids


def test_json_schema_guide_gives_valid_json(served):
    client, out = served
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(out / "tokenizer"))
    for _ in range(3):
        responses = run(client, {"request_output_len": 60, "temperature": 1.0, "runtime_top_p": 1.0,
                                 "end_id": tokenizer.eos_token_id, "num_return_sequences": 3,
                                 "guided_decoding_guide_type": "json_schema",
                                 "guided_decoding_guide": json.dumps(SCHEMA)})
        for response in responses:
            jsonschema.validate(json.loads(tokenizer.decode(response["output_ids"].reshape(-1))), SCHEMA)


@pytest.mark.parametrize(("values", "message"), [
    ({"runtime_min_p": 1.5}, "runtime_min_p must be a number in [0, 1], got 1.5; send one that is, or leave "
                             "runtime_min_p out."),
    ({"repetition_penalty": 0.0}, "repetition_penalty must be a number greater than 0, got 0.0; send one that is, or "
                                  "leave repetition_penalty out."),
    ({"guided_decoding_guide_type": "xml", "guided_decoding_guide": "<a/>"}, "guided_decoding_guide_type must be one "
     "of json, json_schema, regex, ebnf_grammar, choice, got 'xml'; send one of them, or no guide."),
    ({"input_lengths": 99}, f"input_lengths must be an integer from 1 to {len(PROMPT)} (the ids in input_ids), got "
                            "99; send one that is, or leave input_lengths out."),
    ({"end_id": -2}, "end_id must be an integer from -1 to 2**31 - 1, got -2; send one that is, or leave end_id out."),
])
def test_bad_values_are_refused_naming_the_field(served, values, message):
    client, _ = served
    with pytest.raises(RuntimeError) as caught:
        run(client, {"request_output_len": 2, **values})
    assert message in str(caught.value)


def test_keep_end_token_returns_the_end_token_with_its_logprob(served):
    """With the kit's ``keep_end_token`` the token equal to ``end_id`` is the last of ``output_ids`` with its logprob
    and in ``cum_log_probs``, whole and streamed; without it the token is left out (upstream's executor)."""
    client, out = served
    greedy = local(out, SamplingParams(max_tokens=4, top_k=1, logprobs=0))
    end_id = greedy.output_ids[1]  # the second greedy token ends the sequence
    assert end_id != greedy.output_ids[0]
    values = {"request_output_len": 4, "runtime_top_k": 1, "end_id": end_id, "return_log_probs": True}
    [left_out] = run(client, values)
    assert left_out["output_ids"].reshape(-1).tolist() == greedy.output_ids[:1]
    logprobs = [e.logprob for e in greedy.output_logprobs[:2]]
    for responses in (run(client, {**values, "keep_end_token": True}),
                      run(client, {**values, "keep_end_token": True, "streaming": True})):
        ids = [t for r in responses for t in r["output_ids"].reshape(-1).tolist()]
        assert ids == greedy.output_ids[:2]
        assert [v for r in responses for v in r["output_log_probs"].reshape(-1).tolist()] == pytest.approx(
            logprobs, abs=1e-5)
        assert responses[-1]["cum_log_probs"].reshape(-1) == pytest.approx([sum(logprobs)], abs=1e-4)
