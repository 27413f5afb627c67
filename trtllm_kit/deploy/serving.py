"""What answers on a serving pod, said once: its health paths, the endpoints Prometheus scrapes, its queue.

Every layout serves through Triton (``trtllm-kit serve`` on one node, the leader's ranks across nodes, with the
kit's OpenAI frontend beside rank 0) except the llmapi target across nodes, where rank 0 is upstream's
``trtllm-serve``: health on ``/health``, Prometheus text on ``/prometheus/metrics`` (TensorRT-LLM mounts it when
``return_perf_metrics`` is on). Its queue depends on the image's TensorRT-LLM:

- 1.3 and later export the gauge ``trtllm_num_requests_waiting`` (TensorRT-LLM PRs #12545 and #12564, 2026-03);
- 1.2.1, the version NVIDIA's Triton containers ship, exports request histograms only: the queue is read from the
  time requests spent waiting, ``rate(request_queue_time_seconds_sum[1m])``, which by Little's law is the mean
  number of requests waiting over the minute (counted as they leave the queue). The name carries ``trtllm_``
  in later builds and none in 1.1 (vllm-project/aibrix#2004), so the query matches both spellings. The histogram
  appears with the first finished request, so while the pods are scraped and none has finished the query reads 0.

A version the tag does not state is read as older than 1.3.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from string import Template

from trtllm_kit.deploy.image import image_trtllm_version
from trtllm_kit.deploy.settings import DeploySettings
from trtllm_kit.deploy.source import DeploySource
from trtllm_kit.enums import GroupLaunch
from trtllm_kit.targets import get_target

QUEUE_GAUGE_SINCE = (1, 3)  # the first TensorRT-LLM release whose trtllm-serve exports trtllm_num_requests_waiting
RELEASE = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")


@dataclass(frozen=True)
class Serving:
    """The serving process's contract with the kubelet and with Prometheus.

    ``waiting`` is the queue as PromQL with a ``$sel`` slot for the deployment's label matchers; ``appears_late``
    says its series exist only once a request has finished.
    """

    name: str
    ready_path: str
    live_path: str
    health_port: str  # the container port name the probes use
    ports: tuple[str, ...]  # the container ports it listens on
    metrics: tuple[tuple[str, str], ...]  # (port name, path) the PodMonitor scrapes
    waiting: str
    appears_late: bool = False

    def queue(self, matchers: str) -> str:
        """The queue expression for the series ``matchers`` (label matchers without braces) select."""
        return Template(self.waiting).substitute(sel=matchers)


TRITON = Serving("triton", "/v2/health/ready", "/v2/health/live", "http", ("http", "grpc", "metrics", "openai"),
                 (("metrics", "/metrics"), ("openai", "/metrics")),
                 'nv_trt_llm_request_metrics{$sel,request_type="waiting"}')
TRTLLM_SERVE_GAUGE = Serving("trtllm-serve", "/health", "/health", "openai", ("openai",),
                             (("openai", "/prometheus/metrics"),), "trtllm_num_requests_waiting{$sel}")
TRTLLM_SERVE = Serving("trtllm-serve", "/health", "/health", "openai", ("openai",),
                       (("openai", "/prometheus/metrics"),),
                       'rate({__name__=~"(trtllm_)?request_queue_time_seconds_sum",$sel}[1m])', appears_late=True)


def has_queue_gauge(trtllm_version: str | None) -> bool:
    """Whether a TensorRT-LLM release's trtllm-serve exports ``trtllm_num_requests_waiting`` (release candidates
    and unknown versions: no)."""
    found = RELEASE.match(trtllm_version or "")
    return found is not None and (int(found.group(1)), int(found.group(2))) >= QUEUE_GAUGE_SINCE


def serving_of(target: str, num_nodes: int, trtllm_version: str | None = None) -> Serving:
    """What serves ``target`` on ``num_nodes`` pods per replica.

    Arguments:
        target: the artifact's target; num_nodes: pods per replica; trtllm_version: the image's TensorRT-LLM.
    """
    if get_target(target).group_launch is GroupLaunch.LLMAPI_LAUNCH and num_nodes > 1:
        return TRTLLM_SERVE_GAUGE if has_queue_gauge(trtllm_version) else TRTLLM_SERVE
    return TRITON


def serving_for(source: DeploySource, settings: DeploySettings, num_nodes: int) -> Serving:
    """``serving_of`` with the TensorRT-LLM the pods run: the image's (tag or ``--image-trtllm-version``), else the
    one the artifact was built with.

    Arguments:
        source: the artifact; settings: the image; num_nodes: pods per replica.
    """
    version = image_trtllm_version(settings.image or "", settings.image_trtllm_version) or source.tensorrt_llm
    return serving_of(source.target, num_nodes, version)
