"""What answers on a serving pod, said once: its health paths, the endpoints Prometheus scrapes, its queue series.

Every layout serves through Triton (``trtllm-kit serve`` on one node, the leader's ranks across nodes, with the
kit's OpenAI frontend beside rank 0) except the llmapi target across nodes, where rank 0 is upstream's
``trtllm-serve``: health on ``/health``, Prometheus text on ``/prometheus/metrics`` (TensorRT-LLM mounts it when
``return_perf_metrics`` is on), its queue as ``trtllm_num_requests_waiting``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trtllm_kit.enums import GroupLaunch
from trtllm_kit.targets import get_target


@dataclass(frozen=True)
class Serving:
    """The serving process's contract with the kubelet and with Prometheus."""

    name: str
    ready_path: str
    live_path: str
    health_port: str  # the container port name the probes use
    ports: tuple[str, ...]  # the container ports it listens on
    metrics: tuple[tuple[str, str], ...]  # (port name, path) the PodMonitor scrapes
    waiting: str  # the queue gauge
    waiting_labels: dict[str, str] = field(default_factory=dict)  # the matchers that pick the waiting requests


TRITON = Serving("triton", "/v2/health/ready", "/v2/health/live", "http", ("http", "grpc", "metrics", "openai"),
                 (("metrics", "/metrics"), ("openai", "/metrics")), "nv_trt_llm_request_metrics",
                 {"request_type": "waiting"})
TRTLLM_SERVE = Serving("trtllm-serve", "/health", "/health", "openai", ("openai",),
                       (("openai", "/prometheus/metrics"),), "trtllm_num_requests_waiting")


def serving_of(target: str, num_nodes: int) -> Serving:
    """What serves ``target`` on ``num_nodes`` pods per replica.

    Arguments:
        target: the artifact's target; num_nodes: pods per replica.
    """
    return TRTLLM_SERVE if get_target(target).group_launch is GroupLaunch.LLMAPI_LAUNCH and num_nodes > 1 else TRITON
