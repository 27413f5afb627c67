"""A real tritonserver (nvidia-pytriton's) serves the llmapi repository through the kit's model file, with the CPU
runtime behind the ``LLM`` interface: text and token ids, streaming and not, token-exact against the CPU runtime
run directly; the nv_trt_llm_* gauges on /metrics."""

from __future__ import annotations

import queue
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

from tests.integration.tritonserver import grpc_inputs, metrics
from trtllm_kit.llmapi.load import load_unified
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.executor import Executor
from trtllm_kit.runtime.sequence import SamplingParams

grpcclient = pytest.importorskip("tritonclient.grpc")
MAX_TOKENS = 8
PROMPT = "The capital of France is"


def expected(out: Path, ids: list[int]) -> list[int]:
    tokenizer = AutoTokenizer.from_pretrained(str(out / "checkpoint"))
    engine = Executor(load_unified(out / "checkpoint"), EngineConfig())
    return engine.generate([ids], [SamplingParams(max_tokens=MAX_TOKENS, end_id=tokenizer.eos_token_id)])[0]


def infer(process, inputs: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(process.config.endpoints.url("grpc"))
    tensors = grpc_inputs(inputs)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer("tensorrt_llm", tensors, enable_empty_final_response=True)
        responses = []
        for _ in range(64):  # bounded: one response per token at most, plus the final one
            result, error = results.get(timeout=60)
            assert error is None, error
            response = result.get_response()
            if response.outputs:
                responses.append({o.name: result.as_numpy(o.name) for o in response.outputs})
            if response.parameters["triton_final_response"].bool_param:
                return responses
        raise AssertionError("no final response")
    finally:
        client.stop_stream()
        client.close()


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("as_ids", [False, True])
def test_tokens_match_the_cpu_runtime(llmapi_server, streaming: bool, as_ids: bool) -> None:
    out, process = llmapi_server
    ids = AutoTokenizer.from_pretrained(str(out / "checkpoint")).encode(PROMPT)
    inputs = {"input_ids": np.array(ids, np.int32)} if as_ids else {"text_input": np.array([PROMPT], np.object_)}
    inputs.update(sampling_param_max_tokens=np.array([MAX_TOKENS], np.int32), streaming=np.array([streaming]),
                  return_finish_reason=np.array([True]))
    responses = infer(process, inputs)
    tokens = [int(t) for r in responses for t in r["output_ids"]]
    assert tokens == expected(out, ids)
    assert int(responses[-1]["num_output_tokens"][0]) == len(tokens)
    assert int(responses[-1]["num_input_tokens"][0]) == len(ids)
    text = "".join(v.decode() for r in responses for v in r["text_output"])
    tokenizer = AutoTokenizer.from_pretrained(str(out / "checkpoint"))
    assert text == tokenizer.decode(tokens, skip_special_tokens=True)
    if not streaming:
        assert len(responses) == 1 and responses[0]["finish_reason"][0].decode() in ("length", "stop")


def test_gauges_are_published(llmapi_server) -> None:
    _, process = llmapi_server
    infer(process, {"text_input": np.array([PROMPT], np.object_),
                    "sampling_param_max_tokens": np.array([MAX_TOKENS], np.int32)})
    blocks = metrics(process, "nv_trt_llm_kv_cache_block_metrics")
    requests = metrics(process, "nv_trt_llm_request_metrics")
    assert blocks["max"] > 0 and blocks["tokens_per"] == 32
    assert requests["max"] == 8
