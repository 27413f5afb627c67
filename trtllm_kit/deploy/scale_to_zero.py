"""Scale to zero: KEDA's HTTP add-on ``HTTPScaledObject`` (``http.keda.sh/v1alpha1``) in place of the queue's
ScaledObject.

A ScaledObject with ``minReplicaCount: 0`` scales to zero, but then the Service has no endpoints and the first
request is refused. The add-on's interceptor sits in front of the Service instead: it counts the requests in flight
per host, scales the workload from zero when one arrives, holds it until a replica is ready and then passes it on.
It scales on those requests (``scalingMetric.concurrency``, per replica: a full batch and the queue target), so it
replaces the Prometheus trigger; KEDA admits one scaler per workload.

The interceptor holds a request at most ``timeouts.conditionWait`` (its global default has no bound of its own but
the request's), set here to the startup budget, so a request that arrives at zero waits out a whole cold start and
no longer. Clients reach the deployment through the interceptor's proxy Service (``keda-add-ons-http-interceptor-
proxy`` in KEDA's namespace) with the ``Host`` the object lists: the clients' Service's cluster name.
"""

from __future__ import annotations

from typing import Any

from trtllm_kit.deploy.autoscale import target_ref
from trtllm_kit.deploy.objects import Names
from trtllm_kit.deploy.settings import DeploySettings
from trtllm_kit.deploy.source import DeploySource

Obj = dict[str, Any]
API_VERSION = "http.keda.sh/v1alpha1"
SCALEDOWN_S = 600  # ten minutes idle before the last replica goes: a cold start costs minutes
RESPONSE_HEADER_S = 300  # the first token of a long prompt on a loaded replica


def service_host(names: Names) -> str:
    """The clients' Service's cluster name, the ``Host`` the interceptor routes by."""
    return f"{names.service}.{names.namespace}.svc.cluster.local"


def http_scaled_object(names: Names, source: DeploySource, settings: DeploySettings, startup_s: int,
                       multi_node: bool) -> Obj:
    """The ``HTTPScaledObject`` of a deployment that scales to zero.

    Arguments:
        names: the deployment; source: its max batch; settings: replicas, queue target, OpenAI port;
        startup_s: the startup budget (how long the interceptor holds a request); multi_node: a LeaderWorkerSet.
    """
    per_replica = source.max_batch_size + max(1, round(settings.queue_target))
    ref = {**target_ref(names, multi_node), "service": names.service, "port": settings.openai_port}
    return {"apiVersion": API_VERSION, "kind": "HTTPScaledObject", "metadata": names.meta(),
            "spec": {"hosts": [service_host(names), names.service], "scaleTargetRef": ref,
                     "replicas": {"min": settings.min_replicas, "max": settings.max_replicas},
                     "scalingMetric": {"concurrency": {"targetValue": per_replica}},
                     "scaledownPeriod": SCALEDOWN_S,
                     "timeouts": {"conditionWait": f"{startup_s}s", "responseHeader": f"{RESPONSE_HEADER_S}s"}}}


def condition_wait_s(doc: Obj) -> int | None:
    """Seconds an ``HTTPScaledObject`` holds a request at zero (None: not stated in whole seconds)."""
    text = str(((doc.get("spec") or {}).get("timeouts") or {}).get("conditionWait", ""))
    return int(text[:-1]) if text.endswith("s") and text[:-1].isdigit() else None
