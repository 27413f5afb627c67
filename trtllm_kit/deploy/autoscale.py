"""Autoscaling on the queue: a KEDA ScaledObject (prometheus trigger) or an ``autoscaling/v2`` HPA.

Both scale the Deployment or the LeaderWorkerSet (its ``/scale`` counts groups and selects leaders) with the same
behaviour: up at most 2 replicas a minute after a minute of steady demand, down one replica per 5 minutes after
10 minutes without the load that justified it, so a bursty queue does not flap.

Both fail safe when the signal is missing. KEDA is told not to read an empty result as 0
(``ignoreNullValues: "false"``, its default is true), so a query that returns nothing is an error, and after
``FALLBACK_FAILURES`` failed polls its ``fallback`` keeps the running replicas (at least ``fallback_replicas``)
instead of scaling down to the minimum. The HPA acts the same way by itself: a Pods metric the adapter cannot
serve fails the HPA's ``ScalingActive`` condition and it keeps the current replica count.
"""

from __future__ import annotations

from typing import Any

from trtllm_kit.deploy.monitoring import ADAPTER_METRIC, waiting_query
from trtllm_kit.deploy.objects import Names
from trtllm_kit.deploy.serving import Serving
from trtllm_kit.deploy.settings import DeploySettings
from trtllm_kit.deploy.versions import FALLBACK_BEHAVIOR

Obj = dict[str, Any]
BEHAVIOR: Obj = {
    "scaleUp": {"stabilizationWindowSeconds": 60, "selectPolicy": "Max",
                "policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}]},
    "scaleDown": {"stabilizationWindowSeconds": 600, "selectPolicy": "Max",
                  "policies": [{"type": "Pods", "value": 1, "periodSeconds": 300}]},
}
POLLING_S = 15
FALLBACK_FAILURES = 3  # polls (45 s) before KEDA holds the replicas


def target_ref(names: Names, multi_node: bool) -> Obj:
    if multi_node:
        return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "name": names.name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "name": names.name}


def _target(settings: DeploySettings) -> str:
    return f"{settings.queue_target:g}"


def fallback(settings: DeploySettings) -> Obj:
    """KEDA's ``fallback``: after ``FALLBACK_FAILURES`` failed polls keep the running replicas, at least
    ``fallback_replicas`` (``currentReplicasIfHigher``, KEDA 2.17+); before 2.17 KEDA knows only the static
    fallback, which holds ``fallback_replicas`` exactly.

    Arguments:
        settings: the replicas and the cluster's KEDA version.
    """
    found: Obj = {"failureThreshold": FALLBACK_FAILURES,
                  "replicas": settings.fallback_replicas or settings.min_replicas}
    if settings.versions.has(FALLBACK_BEHAVIOR):
        found["behavior"] = "currentReplicasIfHigher"
    return found


def scaled_object(names: Names, settings: DeploySettings, multi_node: bool, serving: Serving) -> Obj:
    """KEDA: the queue query against Prometheus, ``AverageValue`` per replica, the behaviour above.

    Arguments:
        names: the deployment; settings: targets and bounds; multi_node: a LeaderWorkerSet; serving: its queue.
    """
    trigger = {"type": "prometheus", "metricType": "AverageValue", "name": "requests-waiting",
               "metadata": {"serverAddress": settings.prometheus_url, "query": waiting_query(names, serving),
                            "threshold": _target(settings), "ignoreNullValues": "false"}}
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": names.meta(),
            "spec": {"scaleTargetRef": target_ref(names, multi_node), "pollingInterval": POLLING_S,
                     "cooldownPeriod": 300, "minReplicaCount": settings.min_replicas,
                     "maxReplicaCount": settings.max_replicas, "fallback": fallback(settings),
                     "advanced": {"horizontalPodAutoscalerConfig": {"behavior": BEHAVIOR}},
                     "triggers": [trigger]}}


def horizontal_pod_autoscaler(names: Names, settings: DeploySettings, multi_node: bool) -> Obj:
    """HPA ``autoscaling/v2`` on the adapter's per-pod queue metric (see ``monitoring.adapter_rules``)."""
    metric = {"type": "Pods", "pods": {"metric": {"name": ADAPTER_METRIC},
                                       "target": {"type": "AverageValue", "averageValue": _target(settings)}}}
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": names.meta(),
            "spec": {"scaleTargetRef": target_ref(names, multi_node), "minReplicas": settings.min_replicas,
                     "maxReplicas": settings.max_replicas, "metrics": [metric], "behavior": BEHAVIOR}}
