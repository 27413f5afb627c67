"""A real ``tritonserver`` (the nvidia-pytriton build) for integration tests, started with the kit's launcher."""

from __future__ import annotations

import os
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
