"""A real ``tritonserver`` (the nvidia-pytriton build) for integration tests, started with the kit's launcher; its
metrics; gRPC inputs, and streams of requests to the ``tensorrt_llm`` model."""

from __future__ import annotations

import os
import queue
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families

from trtllm_kit.serve.server.launcher import LaunchConfig, free_endpoints
from trtllm_kit.serve.server.locate import pytriton_install
from trtllm_kit.serve.server.process import TritonProcess


@contextmanager
def running_server(repo: Path, workdir: Path, timeout_s: float = 90.0) -> Iterator[TritonProcess]:
    """Serve ``repo`` on free loopback ports until the block ends; skip when no server is installed.

    Arguments:
        repo: the model repository; workdir: for the backend links and ``server.log``; timeout_s: readiness wait.
    """
    install = pytriton_install(workdir / "cache")
    if install is None:
        pytest.skip("nvidia-pytriton's tritonserver is not installed (pip install 'trtllm-kit[serve-cpu]')")
    config = LaunchConfig(repo=repo, endpoints=free_endpoints(), shm_prefix=f"trtllmkit_test{os.getpid()}_")
    server = TritonProcess(install, config, workdir / "server.log")
    server.start()
    server.wait_ready(timeout_s)
    try:
        yield server
    finally:
        server.stop(is_idle=_all_answered)


def _all_answered() -> bool:
    """What a test's server holds when its block ends: nothing, since every test reads its requests to their final
    response. So once tritonserver logs that no inference is in flight, ``stop`` ends the group rather than waiting
    while Triton unloads the idle Python stubs one per second."""
    return True


def metrics(server: TritonProcess, family: str) -> dict[str, float]:
    """One metric family from ``/metrics``, keyed by the value of its non-model label.

    Arguments:
        server: a running server; family: e.g. ``nv_trt_llm_kv_cache_block_metrics``.
    """
    with urllib.request.urlopen(f"http://{server.config.endpoints.url('metrics')}/metrics", timeout=5) as response:
        text = response.read().decode()
    values = {}
    for found in text_string_to_metric_families(text):
        for sample in (s for s in found.samples if found.name == family):
            label = next(v for k, v in sample.labels.items() if k not in ("model", "version"))
            values[label] = sample.value
    return values


TRITON_DTYPES = {np.object_: "BYTES", np.int32: "INT32", np.bool_: "BOOL", np.float32: "FP32"}


def grpc_inputs(inputs: dict[str, np.ndarray]) -> list[grpcclient.InferInput]:
    """``inputs`` as tritonclient gRPC inputs, each with its array's shape and Triton data type."""
    tensors = []
    for name, value in inputs.items():
        tensor = grpcclient.InferInput(name, list(value.shape), TRITON_DTYPES[value.dtype.type])
        tensor.set_data_from_numpy(value)
        tensors.append(tensor)
    return tensors


def tensorrt_llm_inputs(prompt: list[int], max_tokens: int, streaming: bool = True) -> list[grpcclient.InferInput]:
    """The ``tensorrt_llm`` model's inputs for a request of ``prompt`` (token ids) and ``max_tokens``."""
    return grpc_inputs({"input_ids": np.array([prompt], np.int32), "input_lengths": np.array([[len(prompt)]], np.int32),
                        "request_output_len": np.array([[max_tokens]], np.int32),
                        "streaming": np.array([[streaming]], bool)})


class Streams:
    """One gRPC stream carrying several requests; collects tokens and errors per request id."""

    def __init__(self, server: TritonProcess) -> None:
        self.client = grpcclient.InferenceServerClient(server.config.endpoints.url("grpc"))
        self.events: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.events.put((result, error)))

    def send(self, request_id: str, prompt: list[int], max_tokens: int) -> None:
        self.client.async_stream_infer("tensorrt_llm", tensorrt_llm_inputs(prompt, max_tokens), request_id=request_id,
                                       enable_empty_final_response=True)

    def collect(self, num_requests: int, timeout_s: float = 60.0) -> tuple[dict[str, list[int]], list[str]]:
        tokens, errors, done = {}, [], 0
        while done < num_requests:
            result, error = self.events.get(timeout=timeout_s)
            if error is not None:
                errors.append(str(error))
                done += 1
                continue
            response = result.get_response()
            ids = result.as_numpy("output_ids")
            if ids is not None:
                tokens.setdefault(response.id, []).extend(ids.reshape(-1).tolist())
            done += response.parameters["triton_final_response"].bool_param
        return tokens, errors

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()
