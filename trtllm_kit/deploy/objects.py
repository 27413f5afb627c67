"""The objects every deployment has (names, labels, the sha256 list, Service, NetworkPolicy,
PodDisruptionBudget) and the single-node Deployment."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trtllm_kit.deploy.launch import PORTS, serve_command
from trtllm_kit.deploy.pod import pod_spec, resources, server_container, template_annotations
from trtllm_kit.deploy.settings import DeploySettings
from trtllm_kit.deploy.source import DeploySource
from trtllm_kit.deploy.startup import budgets
from trtllm_kit.targets import get_target

Obj = dict[str, Any]
SERVICE_SUFFIX = "-api"
ROUTED_PORTS = ("openai", "metrics")  # the container ports reachable from outside a pod (or a multi-node group)


@dataclass(frozen=True)
class Names:
    """The deployment's name, namespace and the labels that select its serving pods."""

    name: str
    namespace: str

    @property
    def labels(self) -> dict[str, str]:
        return {"app": self.name, "app.kubernetes.io/name": self.name, "app.kubernetes.io/managed-by": "trtllm-kit"}

    @property
    def serving(self) -> dict[str, str]:
        """Labels of the pods that serve (every pod on one node; only leaders on several)."""
        return {"app": self.name, "role": "leader"}

    @property
    def service(self) -> str:
        """The clients' Service: never the workload's own name, which the LeaderWorkerSet controller needs free for
        the group's headless Service (it creates that Service only if none of the LeaderWorkerSet's name exists,
        and the workers' DNS names ``<lws>-<group>-<index>.<lws>`` live in it)."""
        return f"{self.name}{SERVICE_SUFFIX}"

    def meta(self, suffix: str = "", **extra: Any) -> Obj:
        return {"name": f"{self.name}{suffix}", "namespace": self.namespace, "labels": dict(self.labels), **extra}


def sha256_list(names: Names, source: DeploySource) -> Obj:
    """A ConfigMap with ``SHA256SUMS`` (``sha256sum -c`` format) of every artifact file, from the manifest."""
    lines = "".join(f"{f.sha256}  {f.path}\n" for f in source.files)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": names.meta("-sha256"), "data": {"SHA256SUMS": lines}}


def service(names: Names, settings: DeploySettings) -> Obj:
    """A ClusterIP Service over the serving pods: the OpenAI API and the metrics only. Triton's HTTP and gRPC ports
    stay inside the pod (its probes and the frontend reach them there), so no client can go around the API keys."""
    numbers = {"openai": settings.openai_port, "metrics": PORTS["metrics"]}
    ports = [{"name": port, "port": numbers[port], "targetPort": port} for port in ROUTED_PORTS]
    return {"apiVersion": "v1", "kind": "Service", "metadata": names.meta(SERVICE_SUFFIX),
            "spec": {"type": "ClusterIP", "selector": names.serving, "ports": ports}}


def network_policy(names: Names, num_nodes: int) -> Obj:
    """Ingress to the deployment's pods: the OpenAI API and the metrics from anywhere (clients, Prometheus, a
    router's endpoint picker), Triton's own ports and a group's ssh and NCCL traffic from nowhere else; on several
    nodes the group's pods reach each other on every port. Egress stays open (the artifact fetch, DNS). The
    kubelet's probes come from the pod's node, which Kubernetes always lets through.

    Arguments:
        names: the deployment; num_nodes: pods per replica (more than one: a group whose pods talk to each other).
    """
    rules: list[Obj] = [{"ports": [{"protocol": "TCP", "port": port} for port in ROUTED_PORTS]}]
    if num_nodes > 1:
        rules.append({"from": [{"podSelector": {"matchLabels": {"app": names.name}}}]})
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": names.meta(),
            "spec": {"podSelector": {"matchLabels": {"app": names.name}}, "policyTypes": ["Ingress"],
                     "ingress": rules}}


def disruption_budget(names: Names) -> Obj:
    """At most one replica (pod, or group via its leader) evicted at a time; stuck starting pods may go."""
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": names.meta(),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": names.name}},
                     "unhealthyPodEvictionPolicy": "AlwaysAllow"}}


def deployment(names: Names, source: DeploySource, settings: DeploySettings) -> Obj:
    """One pod per replica running every rank (tp x pp <= GPUs per node), started by the target's launcher.

    Arguments:
        names: name and labels; source: the artifact; settings: the deployment.
    """
    budget = budgets(source, settings)
    num_ranks = source.world_size if get_target(source.target).process_per_rank else 1
    command = serve_command(source, settings, budget.startup_s)
    container = server_container(settings, source, command, budget,
                                 resources(source, source.num_gpus, num_ranks, settings))
    labels = {**names.labels, **names.serving}
    spec = pod_spec(names.name, source, settings, [container], budget, names.serving, source.num_gpus, num_ranks)
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": names.meta(),
            "spec": {**replicas(settings), "selector": {"matchLabels": names.serving},
                     "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                     "template": {"metadata": {"labels": labels,
                                               "annotations": template_annotations(source, budget, settings)},
                                  "spec": spec}}}


def replicas(settings: DeploySettings) -> Obj:
    """``replicas`` only without an autoscaler: a re-apply must not reset what the autoscaler chose."""
    return {"replicas": settings.min_replicas} if settings.autoscaler == "none" else {}
