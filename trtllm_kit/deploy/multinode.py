"""Several nodes per replica: a LeaderWorkerSet whose groups hold ``tp x pp / gpus_per_node`` pods.

The leader runs ``mpirun`` over ``kubectl exec`` into the group's workers (so its service account may list pods
and create ``pods/exec`` in the namespace, and nothing else); rank 0 is on the leader, which alone serves and is
alone selected by the Service, the PodMonitor and the autoscaler (LeaderWorkerSet's ``hpaPodSelector``).
"""

from __future__ import annotations

from typing import Any

from trtllm_kit.deploy.launch import KUBESSH, SCRIPTS_DIR, WORKER_COMMAND, leader_script
from trtllm_kit.deploy.objects import Names, replicas
from trtllm_kit.deploy.pod import budgets, pod_spec, resources, server_container
from trtllm_kit.deploy.settings import DeploySettings
from trtllm_kit.deploy.source import DeploySource
from trtllm_kit.errors import KitUsageError

Obj = dict[str, Any]
GROUP_KEY = "leaderworkerset.sigs.k8s.io/group-key"


def num_nodes(source: DeploySource, settings: DeploySettings) -> int:
    """Pods per replica: 1 when every rank fits one node, else world size / GPUs per node (which must divide).

    Arguments:
        source: the artifact; settings: GPUs per node.
    """
    if source.num_gpus <= settings.gpus_per_node:
        return 1
    if source.world_size % settings.gpus_per_node:
        raise KitUsageError(f"tp x pp = {source.world_size} ranks do not fill nodes of {settings.gpus_per_node} "
                            "GPUs evenly; choose --gpus-per-node dividing the world size, or rebuild with another "
                            "layout.")
    return source.world_size // settings.gpus_per_node


def launch_config(names: Names, source: DeploySource, settings: DeploySettings, nodes: int) -> Obj:
    """The ConfigMap with the leader's script and ``kubessh``."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": names.meta("-launch"),
            "data": {"leader.sh": leader_script(source, settings, nodes), "kubessh": KUBESSH}}


def rbac(names: Names) -> list[Obj]:
    """ServiceAccount, Role (get/list/watch pods, create pods/exec) and RoleBinding for the leader."""
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": names.meta("-leader"),
               "automountServiceAccountToken": False}
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": names.meta("-leader"),
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
                      {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create", "get"]}]}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": names.meta("-leader"),
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"{names.name}-leader"},
               "subjects": [{"kind": "ServiceAccount", "name": f"{names.name}-leader", "namespace": names.namespace}]}
    return [account, role, binding]


def leader_worker_set(names: Names, source: DeploySource, settings: DeploySettings, nodes: int) -> Obj:
    """The LeaderWorkerSet: group size = nodes, the whole group recreated when one pod fails.

    Arguments:
        names: name and labels; source: the artifact; settings: the deployment; nodes: pods per group.
    """
    budget = budgets(source, settings)
    gpus = settings.gpus_per_node
    resource = resources(source, gpus, gpus, settings)
    group_env = {"name": "GROUP_KEY", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{GROUP_KEY}']"}}}
    leader = server_container(settings, source, ["/bin/sh", f"{SCRIPTS_DIR}/leader.sh"], budget, resource,
                              scripts=True)
    leader["env"].append(group_env)
    worker = server_container(settings, source, WORKER_COMMAND, budget, resource, serves=False)
    worker_labels = {"app": names.name, "role": "worker"}
    leader_spec = pod_spec(names.name, source, settings, [leader], budget, names.serving, gpus, gpus, scripts=True,
                           service_account=f"{names.name}-leader")
    worker_spec = pod_spec(names.name, source, settings, [worker], budget, worker_labels, gpus, gpus)
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "metadata": names.meta(),
            "spec": {**replicas(settings), "startupPolicy": "LeaderCreated",
                     "rolloutStrategy": {"type": "RollingUpdate",
                                         "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0}},
                     "leaderWorkerTemplate": {
                         "size": nodes, "restartPolicy": "RecreateGroupOnPodRestart",
                         "leaderTemplate": {"metadata": {"labels": {**names.labels, **names.serving}},
                                            "spec": leader_spec},
                         "workerTemplate": {"metadata": {"labels": {**names.labels, **worker_labels}},
                                            "spec": worker_spec}}}}
