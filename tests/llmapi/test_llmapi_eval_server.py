"""The llmapi repository's model file on a real tritonserver, CPU runtime behind the ``LLM`` interface: ``n``
completions as indexed responses, logprob and prompt-logprob tensors, and guided decoding with the recorded
``guided_decoding_backend: xgrammar`` giving schema-valid JSON."""

from __future__ import annotations

import json
import queue
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import yaml

from trtllm_kit.llmapi.load import load_unified
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.executor import Executor
from trtllm_kit.runtime.sequence import SamplingParams

grpcclient = pytest.importorskip("tritonclient.grpc")
PROMPT = [1, 415, 565, 37, 902, 11]
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "size": {"enum": ["s", "m", "l"]}},
          "required": ["ok", "size"], "additionalProperties": False}
DTYPES = {np.int32: "INT32", np.bool_: "BOOL", np.float32: "FP32", np.object_: "BYTES", np.uint64: "UINT64"}


def infer(process, values: dict[str, object]) -> list[dict[str, np.ndarray]]:
    arrays = {"input_ids": np.array(PROMPT, np.int32)}
    for name, value in values.items():
        arrays[name] = np.array([value], np.object_ if isinstance(value, str) else bool if isinstance(value, bool)
                                else np.uint64 if name.endswith("seed") else np.int32 if isinstance(value, int)
                                else np.float32)
    tensors = []
    for name, array in arrays.items():
        tensors.append(grpcclient.InferInput(name, list(array.shape), DTYPES[array.dtype.type]))
        tensors[-1].set_data_from_numpy(array)
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(process.config.endpoints.url("grpc"))
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer("tensorrt_llm", tensors, enable_empty_final_response=True)
        responses = []
        for _ in range(200):  # bounded: a response per completion and step at most, plus the final one
            result, error = results.get(timeout=60)
            if error is not None:
                raise RuntimeError(str(error))
            response = result.get_response()
            if response.outputs:
                responses.append({o.name: result.as_numpy(o.name) for o in response.outputs})
            if response.parameters["triton_final_response"].bool_param:
                return responses
        raise AssertionError("no final response")
    finally:
        client.stop_stream()
        client.close()


def runtime(out: Path, params: SamplingParams):
    engine = Executor(load_unified(out / "checkpoint"), EngineConfig())
    first = engine.add_request(PROMPT, params)
    while engine.has_work():
        engine.step()
    return first


def test_the_recorded_options_name_xgrammar(llmapi_server):
    out, _ = llmapi_server
    assert yaml.safe_load((out / "repo" / "tensorrt_llm" / "1" / "model.yaml").read_text())[
        "guided_decoding_backend"] == "xgrammar"


@pytest.mark.parametrize("streaming", [False, True])
def test_n_completions_are_indexed_responses(llmapi_server, streaming):
    out, process = llmapi_server
    responses = infer(process, {"sampling_param_max_tokens": 6, "sampling_param_temperature": 1.0,
                                "sampling_param_top_p": 1.0, "sampling_param_seed": 3, "sampling_param_n": 3,
                                "sampling_param_ignore_eos": True, "streaming": streaming,
                                "return_finish_reason": True})
    tokens: dict[int, list[int]] = {}
    for response in responses:
        tokens.setdefault(int(response["sequence_index"][0]), []).extend(response["output_ids"].tolist())
    group = runtime(out, SamplingParams(max_tokens=6, temperature=1.0, top_p=1.0, seed=3, n=3)).group
    assert tokens == {seq.index: seq.output_ids for seq in group}


def test_logprob_tensors(llmapi_server):
    out, process = llmapi_server
    [response] = infer(process, {"sampling_param_max_tokens": 5, "sampling_param_temperature": 0.0,
                                 "sampling_param_ignore_eos": True, "sampling_param_logprobs": 2,
                                 "sampling_param_prompt_logprobs": 1, "streaming": False})
    seq = runtime(out, SamplingParams(max_tokens=5, temperature=0.0, logprobs=2, prompt_logprobs=1))
    assert response["output_ids"].tolist() == seq.output_ids
    assert response["output_log_probs"] == pytest.approx([e.logprob for e in seq.output_logprobs], abs=1e-5)
    assert response["top_log_prob_ids"].tolist() == [list(e.top_ids) for e in seq.output_logprobs]
    assert response["prompt_log_probs"][0] == 0.0
    assert response["prompt_log_probs"][1:] == pytest.approx([e.logprob for e in seq.prompt_logprobs[1:]], abs=1e-5)
    assert response["prompt_top_log_prob_ids"].shape == (len(PROMPT), 1)
    assert response["prompt_top_log_prob_ids"][0, 0] == -1


def test_guided_decoding_gives_schema_valid_json(llmapi_server):
    _, process = llmapi_server
    responses = infer(process, {"sampling_param_max_tokens": 60, "sampling_param_temperature": 1.0,
                                "sampling_param_top_p": 1.0, "sampling_param_n": 4, "streaming": False,
                                "guided_decoding_guide_type": "json_schema",
                                "guided_decoding_guide": json.dumps(SCHEMA)})
    assert len(responses) == 4
    for response in responses:
        jsonschema.validate(json.loads(response["text_output"][0].decode()), SCHEMA)
    [choice] = infer(process, {"sampling_param_max_tokens": 10, "streaming": False,
                               "guided_decoding_guide_type": "choice", "guided_decoding_guide": '["yes", "no"]'})
    assert choice["text_output"][0].decode() in ("yes", "no")


def test_unknown_guide_type_is_refused(llmapi_server):
    _, process = llmapi_server
    with pytest.raises(RuntimeError, match="guided_decoding_guide_type must be one of json, json_schema, regex, "
                                           "ebnf_grammar, choice, got 'xml'"):
        infer(process, {"sampling_param_max_tokens": 4, "guided_decoding_guide_type": "xml",
                        "guided_decoding_guide": "<a/>"})
