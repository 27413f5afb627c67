"""Several nodes per replica: a LeaderWorkerSet whose groups hold ``tp x pp / gpus_per_node`` pods.

The leader runs ``trtllm-kit deploy leader`` (``deploy/leader.py``): it waits for the workers' sshd, starts every
rank with ``mpirun`` over ssh (the group's key pair from a Secret), and serves the OpenAI API beside rank 0.
Workers run ``sshd`` only. Nothing talks to the Kubernetes API, so no pod has a service account token. The leader
alone serves and is alone selected by the Service, the PodMonitor and the autoscaler (LeaderWorkerSet's
``hpaPodSelector``). A group is kept in one topology domain (``topology_key``), and every pod requests the
``rdma_resources`` and carries the ``nccl_env`` settings, which ``mpirun`` forwards to every rank.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from trtllm_kit.deploy.launch import (
    LAUNCH_SUFFIX,
    LEADER_COMMAND,
    OPTIONS_FILE,
    PLAN_FILE,
    SSH_DIR,
    SSH_PORT,
    WORKER_COMMAND,
    WORKER_SCRIPT,
    leader_plan,
    llmapi_options,
)
from trtllm_kit.deploy.objects import Names, replicas
from trtllm_kit.deploy.pod import pod_spec, resources, server_container, template_annotations
from trtllm_kit.deploy.serving import TRITON, serving_for
from trtllm_kit.deploy.settings import DeploySettings
from trtllm_kit.deploy.source import DeploySource
from trtllm_kit.deploy.startup import budgets
from trtllm_kit.errors import KitError, KitUsageError

Obj = dict[str, Any]
EXCLUSIVE_TOPOLOGY = "leaderworkerset.sigs.k8s.io/exclusive-topology"


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


def ssh_secret_name(names: Names, settings: DeploySettings) -> str:
    """The Secret with the group's key pair: ``--ssh-secret``, else the one kustomize makes from ``ssh/``."""
    return settings.ssh_secret or f"{names.name}-ssh"


def launch_config(names: Names, source: DeploySource, settings: DeploySettings, nodes: int) -> Obj:
    """The ConfigMap with the leader's plan (JSON) and the workers' sshd script."""
    plan = leader_plan(source, settings, nodes, budgets(source, settings, nodes).startup_s)
    data = {PLAN_FILE: json.dumps(plan.to_dict(), indent=2) + "\n", "worker.sh": WORKER_SCRIPT}
    if serving_for(source, settings, nodes) is not TRITON:
        data[OPTIONS_FILE] = llmapi_options(source)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": names.meta(LAUNCH_SUFFIX), "data": data}


def _group_pod(container: Obj, spec: Obj, names: Names, settings: DeploySettings) -> None:
    """What every pod of a group adds: the NCCL settings, the RDMA resources and the ssh key pair."""
    container["env"] += [{"name": key, "value": value} for key, value in settings.nccl_env.items()]
    for amounts in container["resources"].values():
        amounts.update({name: str(count) for name, count in settings.rdma_resources.items()})
    container["volumeMounts"].append({"name": "ssh", "mountPath": SSH_DIR, "readOnly": True})
    spec["volumes"].append({"name": "ssh", "secret": {"secretName": ssh_secret_name(names, settings),
                                                      "defaultMode": 0o440}})


def leader_worker_set(names: Names, source: DeploySource, settings: DeploySettings, nodes: int) -> Obj:
    """The LeaderWorkerSet: group size = nodes, the whole group recreated when one pod fails.

    Arguments:
        names: name and labels; source: the artifact; settings: the deployment; nodes: pods per group.
    """
    budget = budgets(source, settings, nodes)
    gpus = settings.gpus_per_node
    leader = server_container(settings, source, LEADER_COMMAND, budget, resources(source, gpus, gpus, settings),
                              serving=serving_for(source, settings, nodes), scripts=True)
    worker = server_container(settings, source, WORKER_COMMAND, budget, resources(source, gpus, gpus, settings),
                              serves=False, scripts=True)
    worker.update(ports=[{"name": "ssh", "containerPort": SSH_PORT}],
                  readinessProbe={"tcpSocket": {"port": "ssh"}, "periodSeconds": 5, "failureThreshold": 3})
    worker_labels = {"app": names.name, "role": "worker"}
    leader_spec = pod_spec(names.name, source, settings, [leader], budget, names.serving, gpus, gpus, scripts=True,
                           spread=False)
    worker_spec = pod_spec(names.name, source, settings, [worker], budget, worker_labels, gpus, gpus, scripts=True,
                           spread=False, serves=False)
    for container, spec in ((leader, leader_spec), (worker, worker_spec)):
        _group_pod(container, spec, names, settings)
    metadata = names.meta()
    if settings.topology_key:
        metadata["annotations"] = {EXCLUSIVE_TOPOLOGY: settings.topology_key}
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "metadata": metadata,
            "spec": {**replicas(settings), "startupPolicy": "LeaderCreated",
                     "rolloutStrategy": {"type": "RollingUpdate",
                                         "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0}},
                     "leaderWorkerTemplate": {
                         "size": nodes, "restartPolicy": "RecreateGroupOnPodRestart",
                         "leaderTemplate": {"metadata": {"labels": {**names.labels, **names.serving},
                                                         "annotations": template_annotations(source, budget, settings)},
                                            "spec": leader_spec},
                         "workerTemplate": {"metadata": {"labels": {**names.labels, **worker_labels},
                                                         "annotations": template_annotations(source, budget, settings)},
                                            "spec": worker_spec}}}}


SSH_FILES = ("ssh/id_ed25519", "ssh/id_ed25519.pub")


def write_key_pair(directory: Path) -> None:
    """A fresh Ed25519 pair for the group's ssh in ``directory/ssh`` (private key mode 0600), by ``ssh-keygen``.

    Arguments:
        directory: the deploy directory being written.
    """
    keygen = shutil.which("ssh-keygen")
    if keygen is None:
        raise KitError("ssh-keygen is not on PATH, and a multi-node group needs a key pair for mpirun's ssh; "
                       "install openssh-client, or create a Secret with id_ed25519 and id_ed25519.pub and pass "
                       "--ssh-secret NAME.")
    (directory / "ssh").mkdir()
    done = subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-C", "trtllm-kit group",
                           "-f", str(directory / SSH_FILES[0])], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise KitError(f"ssh-keygen failed ({done.returncode}): {done.stderr.strip()[-300:]}")


def secret_generator(names: Names) -> Obj:
    """The kustomize ``secretGenerator`` entry that applies ``ssh/`` as the group's Secret (its name kept)."""
    return {"name": f"{names.name}-ssh", "namespace": names.namespace, "files": list(SSH_FILES),
            "options": {"disableNameSuffixHash": True, "labels": names.labels}}
