"""The wire against real servers: requests encoded by the wire are taken by a built ``cpu`` repository's
``tensorrt_llm`` model and a built llmapi repository's model on a real tritonserver, and the responses the wire
decodes equal the runtime run in-process (tokens, logprobs, prompt logprobs, sequence index, counts)."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
from kit_server import TINY_BUILDS, Builds  # one module object: keys built here equal the session's

from tests.integration.tritonserver import running_server
from tests.wire.values import batched
from trtllm_kit.llmapi.load import load_unified
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.executor import Executor
from trtllm_kit.runtime.model import CheckpointModel
from trtllm_kit.runtime.sequence import SamplingParams, Sequence
from trtllm_kit.serve.server.process import TritonProcess
from trtllm_kit.wire import GenerationRequest, GenerationResponse
from trtllm_kit.wire.llmapi import encode_llmapi_request
from trtllm_kit.wire.llmapi_response import decode_llmapi_response
from trtllm_kit.wire.tensor import grpc_datatype
from trtllm_kit.wire.trtllm import encode_trtllm_request
from trtllm_kit.wire.trtllm_response import decode_trtllm_response

pytestmark = pytest.mark.integration
PROMPT = (1, 415, 565, 37, 902, 11, 260)
MAX_RESPONSES = 200  # a response per sequence and step at most, plus the final one


def stream(server: TritonProcess, arrays: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """One streamed gRPC request to ``tensorrt_llm``; its responses' outputs, in order (an error fails the test)."""
    inputs = []
    for name, array in arrays.items():
        inputs.append(grpcclient.InferInput(name, list(array.shape), grpc_datatype(array)))
        inputs[-1].set_data_from_numpy(array)
    events: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.config.endpoints.url("grpc"))
    client.start_stream(callback=lambda result, error: events.put((result, error)))
    try:
        client.async_stream_infer("tensorrt_llm", inputs, enable_empty_final_response=True)
        responses = []
        for _ in range(MAX_RESPONSES):
            result, error = events.get(timeout=120)
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


def local(engine: Executor, params: SamplingParams) -> list[Sequence]:
    first = engine.add_request(list(PROMPT), params)
    while engine.has_work():
        engine.step()
    return first.group


@pytest.fixture(scope="module")
def cpu_server(kit_builds: Builds, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TritonProcess, Path]]:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("wire-cpu")
    out = kit_builds.copy(TINY_BUILDS["cpu"], root / "out")
    with running_server(out / "repo", root) as server:
        yield server, out


def test_a_wire_request_to_the_cpu_tensorrt_llm_model(cpu_server) -> None:
    server, out = cpu_server
    req = GenerationRequest(PROMPT, 5, streaming=True, top_k=1, n=2, logprobs=3, prompt_logprobs=3,
                            repetition_penalty=1.25, min_p=0.05, stop_words=((99999,),), exclude_input_in_output=True,
                            return_num_input_tokens=True, return_num_output_tokens=True, keep_end_token=True)
    responses = [decode_trtllm_response(r, PROMPT) for r in stream(server, batched(encode_trtllm_request(req)))]
    engine = Executor(CheckpointModel.load(out / "checkpoint"), EngineConfig())
    expected = local(engine, SamplingParams(max_tokens=5, top_k=1, n=2, logprobs=3, prompt_logprobs=3,
                                            repetition_penalty=1.25, min_p=0.05, stop_words=[[99999]],
                                            keep_end_token=True))
    for seq in expected:
        mine = [r for r in responses if r.sequence_index == seq.index]
        assert tuple(t for r in mine for t in r.token_ids) == tuple(seq.output_ids)
        scored = [s for r in mine for s in r.scored or ()]
        assert [s[1] for s in scored] == pytest.approx([e.logprob for e in seq.output_logprobs], abs=1e-4)
        assert [tuple(t for t, _ in s[2]) for s in scored] == [e.top_ids for e in seq.output_logprobs]
        first: GenerationResponse = mine[0]
        assert first.prompt_scored is not None and first.prompt_scored[0] == (PROMPT[0], None, ())
        assert [s[1] for s in first.prompt_scored[1:]] == pytest.approx(
            [e.logprob for e in seq.prompt_logprobs[1:]], abs=1e-4)
        assert (mine[-1].num_input_tokens, mine[-1].num_output_tokens) == (len(PROMPT), len(seq.output_ids))


@pytest.fixture(scope="module")
def llmapi_server(kit_builds: Builds,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TritonProcess, Path]]:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("wire-llmapi")
    out = kit_builds.copy(TINY_BUILDS["llmapi"], root / "out")
    with running_server(out / "repo", root) as server:
        yield server, out


def test_a_wire_request_to_the_llmapi_model(llmapi_server) -> None:
    server, out = llmapi_server
    req = GenerationRequest(PROMPT, 4, streaming=False, top_k=1, n=2, logprobs=2, prompt_logprobs=1,
                            return_finish_reason=True, keep_end_token=True)
    responses = [decode_llmapi_response(r, PROMPT) for r in stream(server, encode_llmapi_request(req))]
    engine = Executor(load_unified(out / "checkpoint"), EngineConfig())
    expected = local(engine, SamplingParams(max_tokens=4, top_k=1, n=2, logprobs=2, prompt_logprobs=1,
                                            keep_end_token=True))
    assert sorted(r.sequence_index for r in responses) == [0, 1]
    for response in responses:
        seq = expected[response.sequence_index or 0]
        assert response.token_ids == tuple(seq.output_ids) and response.finish_reasons in (("length",), ("stop",))
        assert response.scored is not None and [s[1] for s in response.scored] == pytest.approx(
            [e.logprob for e in seq.output_logprobs], abs=1e-4)
        assert response.prompt_scored is not None and response.prompt_scored[0] == (PROMPT[0], None, ())
        assert (response.num_input_tokens, response.num_output_tokens) == (len(PROMPT), len(seq.output_ids))
