"""Autoscaling a Dynamo graph: each worker role opts into Dynamo's scaling adapter (``scalingAdapter: {}``), and a
KEDA ScaledObject per role scales that adapter (``DynamoGraphDeploymentScalingAdapter``, named
``<graph>-<component, lower-case>``) on a frontend series, with ``deploy k8s``'s behaviour and fallback.

Signals: prefill and aggregated workers on the requests queued at the frontend (``queue_target`` per worker);
decode workers on the requests in flight (the artifact's ``max_batch_size`` per worker: what one decode worker
holds at once).
"""

from __future__ import annotations

from typing import Any

from trtllm_kit.deploy.autoscale import BEHAVIOR, POLLING_S, fallback
from trtllm_kit.deploy.dynamo_roles import Role
from trtllm_kit.deploy.monitoring import selector
from trtllm_kit.deploy.objects import Names
from trtllm_kit.deploy.settings import DeploySettings
from trtllm_kit.deploy.source import DeploySource
from trtllm_kit.errors import KitUsageError

Obj = dict[str, Any]
ADAPTER = {"apiVersion": "nvidia.com/v1beta1", "kind": "DynamoGraphDeploymentScalingAdapter"}
QUEUED = "dynamo_frontend_queued_requests"
INFLIGHT = "dynamo_frontend_inflight_requests"


def adapter_name(names: Names, role: Role) -> str:
    """The adapter the operator creates for a component that sets ``scalingAdapter``."""
    return f"{names.name}-{role.name.lower()}"


def check_autoscaler(settings: DeploySettings) -> bool:
    """Whether the graph is scaled (KEDA); the HPA path needs a metrics adapter the graph does not configure."""
    if settings.autoscaler == "hpa":
        raise KitUsageError("deploy dynamo scales the roles with KEDA; use --autoscaler keda or --autoscaler none.")
    return settings.autoscaler == "keda"


def scaled_object(names: Names, source: DeploySource, settings: DeploySettings, role: Role) -> Obj:
    """KEDA for one worker role: its signal per worker, bounded by ``min_replicas``..``max_replicas``.

    Arguments:
        names: the graph; source: the artifact (decode's per-worker batch); settings: bounds, Prometheus;
        role: the worker role.
    """
    series, per_worker = (INFLIGHT, source.max_batch_size) if role.type == "decode" else (QUEUED,
                                                                                          settings.queue_target)
    trigger = {"type": "prometheus", "metricType": "AverageValue", "name": f"{role.type}-load",
               "metadata": {"serverAddress": settings.prometheus_url,
                            "query": f"sum({series}{{{selector(names)}}})", "threshold": f"{per_worker:g}",
                            "ignoreNullValues": "false"}}
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
            "metadata": names.meta(f"-{role.name.lower()}"),
            "spec": {"scaleTargetRef": {**ADAPTER, "name": adapter_name(names, role)}, "pollingInterval": POLLING_S,
                     "cooldownPeriod": 300, "minReplicaCount": settings.min_replicas,
                     "maxReplicaCount": settings.max_replicas, "fallback": fallback(settings),
                     "advanced": {"horizontalPodAutoscalerConfig": {"behavior": BEHAVIOR}},
                     "triggers": [trigger]}}
