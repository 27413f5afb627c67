"""Routing across replicas through the Gateway API Inference Extension: an ``InferencePool`` over the serving pods,
an ``HTTPRoute`` from the cluster's Gateway to it, and the values its endpoint picker (EPP) needs.

Without it the clients' Service spreads connections round-robin (kube-proxy), blind to each replica's queue and KV
cache. The EPP instead scores every pod from its metrics per the model-server protocol (GIE
``docs/proposals/003-model-server-protocol``): the queued and running requests and the KV-cache use, read under
names that depend on what serves (``modelServerType``). Those names are said once here, per serving process, and
must be series the served image exports: Triton's TensorRT-LLM gauges (the kit's Python models export the same), or
``trtllm-serve``'s gauges, which TensorRT-LLM exports from 1.3 only. The EPP itself is deployed with its own chart
(its ``inferencePool.modelServerType`` and metric flags from ``endpoint-picker-values.yaml``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trtllm_kit.deploy.launch import PORTS
from trtllm_kit.deploy.objects import Names
from trtllm_kit.deploy.serving import TRITON, TRTLLM_SERVE_GAUGE, Serving
from trtllm_kit.deploy.settings import DeploySettings
from trtllm_kit.errors import KitUsageError

Obj = dict[str, Any]
POOL_API = "inference.networking.k8s.io/v1"
ROUTE_API = "gateway.networking.k8s.io/v1"
EPP_SUFFIX = "-epp"
EPP_PORT = 9002  # the endpoint picker's ext-proc gRPC port


@dataclass(frozen=True)
class ModelServer:
    """What the EPP reads from one kind of serving process: its ``modelServerType`` and the protocol's metrics
    (PromQL-style ``name{label="value"}``), at ``metrics_port`` (None: the OpenAI port) and ``metrics_path``."""

    model_server_type: str
    queued: str
    running: str
    kv_cache_utilization: str
    block_size: str
    num_blocks: str
    metrics_port: int | None
    metrics_path: str

    def metrics(self) -> dict[str, str]:
        """The protocol's metric → the series that answers it."""
        return {"TotalQueuedRequests": self.queued, "TotalRunningRequests": self.running,
                "KVCacheUtilization": self.kv_cache_utilization, "BlockSize": self.block_size,
                "NumGPUBlocks": self.num_blocks}


MODEL_SERVERS = {
    TRITON.name: ModelServer("triton-tensorrt-llm", 'nv_trt_llm_request_metrics{request_type="waiting"}',
                             'nv_trt_llm_request_metrics{request_type="scheduled"}',
                             'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}',
                             'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per"}',
                             'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max"}',
                             PORTS["metrics"], "/metrics"),
    TRTLLM_SERVE_GAUGE.name: ModelServer("trtllm-serve", "trtllm_num_requests_waiting", "trtllm_num_requests_running",
                                         "trtllm_kv_cache_utilization", "trtllm_kv_cache_tokens_per_block",
                                         "trtllm_kv_cache_max_blocks", None, "/prometheus/metrics"),
}


def model_server(serving: Serving) -> ModelServer:
    """The EPP's view of ``serving``; refused when its image exports no queue gauge (trtllm-serve before 1.3).

    Arguments:
        serving: what serves (``deploy/serving.py``).
    """
    if serving.name == TRTLLM_SERVE_GAUGE.name and serving is not TRTLLM_SERVE_GAUGE:
        raise KitUsageError("--router inference-extension reads trtllm_num_requests_waiting, which the image's "
                            "trtllm-serve (TensorRT-LLM before 1.3) does not export; use an image with TensorRT-LLM "
                            "1.3 or later, or --router kube-proxy.")
    return MODEL_SERVERS[serving.name]


def inference_pool(names: Names, settings: DeploySettings) -> Obj:
    """The ``InferencePool`` over the serving pods' OpenAI port, picked by ``<name>-epp``; if the picker is down
    requests still flow (``FailOpen``)."""
    return {"apiVersion": POOL_API, "kind": "InferencePool", "metadata": names.meta(),
            "spec": {"selector": {"matchLabels": dict(names.serving)},
                     "targetPorts": [{"number": settings.openai_port}],
                     "endpointPickerRef": {"name": f"{names.name}{EPP_SUFFIX}", "port": {"number": EPP_PORT},
                                           "failureMode": "FailOpen"}}}


def http_route(names: Names, settings: DeploySettings) -> Obj:
    """The ``HTTPRoute`` sending the Gateway's OpenAI paths to the pool."""
    backend = {"group": POOL_API.split("/")[0], "kind": "InferencePool", "name": names.name}
    return {"apiVersion": ROUTE_API, "kind": "HTTPRoute", "metadata": names.meta(),
            "spec": {"parentRefs": [{"name": settings.gateway}],
                     "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
                                "backendRefs": [backend]}]}}


def endpoint_picker_values(names: Names, settings: DeploySettings, server: ModelServer) -> Obj:
    """Values for the endpoint picker's chart: the pool it serves, ``modelServerType`` and the metrics it reads."""
    port = server.metrics_port or settings.openai_port
    return {"inferencePool": {"name": names.name, "modelServerType": server.model_server_type,
                              "modelServers": {"matchLabels": dict(names.serving)},
                              "targetPorts": [{"number": settings.openai_port}]},
            "inferenceExtension": {"name": f"{names.name}{EPP_SUFFIX}", "metricsPort": port,
                                   "metricsPath": server.metrics_path, "metrics": server.metrics()}}
