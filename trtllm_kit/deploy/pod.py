"""The pod of one replica (or of a group's leader or worker): containers, probes, resources, volumes, security.

The probes take their budgets from ``startup.budgets``: the startupProbe allows exactly the startup budget the
server is given; the grace period covers the preStop drain and Triton's exit timeout.
"""

from __future__ import annotations

import math
from typing import Any

from trtllm_kit.deploy import gateway
from trtllm_kit.deploy.launch import CONTAINER, LAUNCH_SUFFIX, PORTS, SCRIPTS_DIR
from trtllm_kit.deploy.placement import MIN_CC_ANNOTATION, min_compute_capability, node_affinity
from trtllm_kit.deploy.serving import TRITON, Serving
from trtllm_kit.deploy.settings import DeploySettings
from trtllm_kit.deploy.source import DeploySource
from trtllm_kit.deploy.startup import BUDGET_ANNOTATION, PROBE_PERIOD_S, Budgets
from trtllm_kit.deploy.versions import SIDECARS, SLEEP_ACTION

Obj = dict[str, Any]
SUMS_DIR = "/etc/trtllm-kit"
GIB = 1024**3


def probes(budget: Budgets, serving: Serving) -> Obj:
    """Startup and readiness on the ready path (Triton: every model loaded), liveness on the live path.

    Arguments:
        budget: the startup budget; serving: what serves (its health paths and port).
    """
    ready = {"httpGet": {"path": serving.ready_path, "port": serving.health_port}}
    return {"startupProbe": {**ready, "periodSeconds": PROBE_PERIOD_S, "failureThreshold": budget.startup_failures},
            "readinessProbe": {**ready, "periodSeconds": 5, "failureThreshold": 3},
            "livenessProbe": {"httpGet": {"path": serving.live_path, "port": serving.health_port},
                              "periodSeconds": 10, "failureThreshold": 3}}


def resources(source: DeploySource, num_gpus: int, num_ranks: int, settings: DeploySettings) -> Obj:
    """Requests = limits: the pod's GPUs, ``max(4, GPUs)`` CPUs, 8 GiB per CPU plus ``/dev/shm``.

    Arguments:
        source: the artifact; num_gpus: GPUs of this pod; num_ranks: server processes in it; settings: shm size.
    """
    cpus = max(4, num_gpus)
    memory_gib = cpus * 8 + math.ceil(num_ranks * _gib(settings.shm_per_rank))
    amounts: Obj = {"cpu": str(cpus), "memory": f"{memory_gib}Gi"}
    if num_gpus:
        amounts["nvidia.com/gpu"] = str(num_gpus)
    if settings.artifact_url is not None:
        amounts["ephemeral-storage"] = f"{math.ceil(source.total_bytes * 1.1 / GIB) + 1}Gi"
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _gib(quantity: str) -> float:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return float(quantity[: -len(suffix)]) * factor / GIB
    return float(quantity) / GIB


def security() -> tuple[Obj, Obj]:
    """(pod, container) security contexts: uid 1000 (``triton-server`` in NVIDIA's images), nothing extra."""
    pod = {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
           "seccompProfile": {"type": "RuntimeDefault"}}
    container = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    return pod, container


def artifact_mounts(source: DeploySource, settings: DeploySettings) -> list[Obj]:
    """How every container that reads the artifact sees it, at its mount path: the claim itself, read-only
    (``--pvc``), or the ``emptyDir`` the tar was unpacked into (``--artifact-url``).

    The claim is not linked into another directory: links dangle in every container that does not mount the
    claim at the links' target, and ``trtllm-kit serve`` refuses an artifact that holds symlinks
    (``artifact/integrity.py``); the server keeps its run state outside the artifact, so read-only is enough.

    Arguments:
        source: the artifact (its mount path); settings: the delivery.
    """
    if settings.pvc is not None:
        return [{"name": "pvc", "mountPath": source.mount_path, "readOnly": True}]
    return [{"name": "artifact", "mountPath": source.mount_path}]


def fetch_container(source: DeploySource, settings: DeploySettings) -> Obj:
    """The init container that puts the artifact at its mount path (a tar from a URL, streamed and unpacked; a
    claim is there already) and checks every file's sha256 against the list taken from the manifest at deploy
    time: ``sha256sum -c`` must pass before the server starts.

    Arguments:
        source: the artifact; settings: the delivery (``artifact_url`` or ``pvc``).
    """
    mount = source.mount_path
    if settings.artifact_url is not None:
        get = ("python3 -c 'import shutil, sys, urllib.request; "
               "shutil.copyfileobj(urllib.request.urlopen(sys.argv[1]), sys.stdout.buffer)' \"$ARTIFACT_URL\" | "
               f"tar -x -C {mount}")
        env = [{"name": "ARTIFACT_URL", "value": settings.artifact_url}]
        get = f"{get}; "
    else:
        get, env = "", []
    mounts = [*artifact_mounts(source, settings), {"name": "sums", "mountPath": SUMS_DIR, "readOnly": True}]
    _, container_security = security()
    return {"name": "fetch-artifact", "image": settings.image, "command": ["/bin/sh", "-c"],
            "args": [f"set -eu; {get}cd {mount}; sha256sum --check --quiet --strict {SUMS_DIR}/SHA256SUMS"],
            "env": env, "volumeMounts": mounts, "securityContext": container_security,
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}}}


def shm_size(settings: DeploySettings, num_ranks: int) -> str:
    """``/dev/shm`` of a pod running ``num_ranks`` server processes: ``shm_per_rank`` each, whole GiB, at least 1."""
    return f"{max(1, math.ceil(num_ranks * _gib(settings.shm_per_rank)))}Gi"


def volumes(name: str, source: DeploySource, settings: DeploySettings, num_ranks: int, *,
            scripts: bool = False) -> list[Obj]:
    """The artifact (the claim, or an ``emptyDir`` sized for the tar), the sha256 list, ``/dev/shm`` in memory
    (``shm_per_rank`` per rank), and the launch scripts.

    Arguments:
        name: the deployment's name (ConfigMap prefix); source: the artifact; settings: delivery and shm size;
        num_ranks: server processes in the pod; scripts: mount the multi-node launch scripts.
    """
    if settings.pvc is not None:
        artifact: Obj = {"name": "pvc", "persistentVolumeClaim": {"claimName": settings.pvc, "readOnly": True}}
    else:
        artifact = {"name": "artifact", "emptyDir": {"sizeLimit": f"{math.ceil(source.total_bytes * 1.1 / GIB) + 1}Gi"}}
    found = [artifact, {"name": "sums", "configMap": {"name": f"{name}-sha256"}},
             {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size(settings, num_ranks)}}]
    if scripts:
        found.append({"name": "launch", "configMap": {"name": f"{name}{LAUNCH_SUFFIX}", "defaultMode": 0o555}})
    return found


def server_container(settings: DeploySettings, source: DeploySource, command: list[str], budget: Budgets,
                     resource: Obj, *, serving: Serving = TRITON, serves: bool = True, scripts: bool = False) -> Obj:
    """The server container: command, ports, probes (when it serves), drain, resources, mounts.

    Arguments:
        settings: image and drain; source: the mount path; command: its argv; budget: probe budgets;
        resource: requests and limits; serving: what serves (ports, health); serves: rank 0 lives here (ports and
        probes); scripts: mount launch scripts.
    """
    _, container_security = security()
    numbers = {**PORTS, "openai": settings.openai_port}
    ports = [{"name": kind, "containerPort": numbers[kind]} for kind in serving.ports]
    env: list[Obj] = [{"name": n, "valueFrom": {"fieldRef": {"fieldPath": f}}}
           for n, f in (("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace"))]
    mounts: list[Obj] = [*artifact_mounts(source, settings), {"name": "dshm", "mountPath": "/dev/shm"}]
    if scripts:
        mounts.append({"name": "launch", "mountPath": SCRIPTS_DIR, "readOnly": True})
    container: Obj = {"name": CONTAINER, "image": settings.image, "command": command, "env": env,
                      "resources": resource, "volumeMounts": mounts, "securityContext": container_security}
    if serves:
        mounts += gateway.mounts(settings)
        container.update({"ports": ports, **probes(budget, serving), "lifecycle": {"preStop": drain(settings)}})
    return container


def drain(settings: DeploySettings) -> Obj:
    """The preStop handler that waits ``drain_s`` while the Service stops routing to the pod: the ``sleep`` action
    (Kubernetes 1.30+), else ``sleep`` run in the container."""
    if settings.versions.has(SLEEP_ACTION):
        return {"sleep": {"seconds": settings.drain_s}}
    return {"exec": {"command": ["sleep", str(settings.drain_s)]}}


def pod_spec(name: str, source: DeploySource, settings: DeploySettings, containers: list[Obj], budget: Budgets,
             selector: dict[str, str], num_gpus: int, num_ranks: int, *, scripts: bool = False,
             spread: bool = True, serves: bool = True) -> Obj:
    """A pod spec around ``containers``: the fetch init container, volumes, security, spreading, GPU toleration.

    Arguments:
        name: the deployment's name; source: the artifact; settings: the deployment; containers: the main ones;
        budget: the grace period; selector: labels to spread by; num_gpus: GPUs of the pod; num_ranks: processes;
        scripts: mount the launch scripts; spread: spread replicas over nodes and zones (one-node replicas; a
        group is kept in one domain instead); serves: the OpenAI frontend runs here (the gateway's Secret and
        usage-log sidecar).
    """
    pod_security, container_security = security()
    sidecars = gateway.usage_sidecar(settings, container_security) if serves else []
    native = settings.versions.has(SIDECARS)
    if not native:  # before 1.29: an ordinary container beside the server
        sidecars = [{k: v for k, v in sidecar.items() if k != "restartPolicy"} for sidecar in sidecars]
    spec: Obj = {
        "terminationGracePeriodSeconds": budget.grace_s, "securityContext": pod_security,
        "automountServiceAccountToken": False,
        "initContainers": [fetch_container(source, settings), *(sidecars if native else [])],
        "containers": [*containers, *([] if native else sidecars)],
        "volumes": volumes(name, source, settings, num_ranks, scripts=scripts) +
        (gateway.volumes(settings) if serves else []),
    }
    if spread:
        spec["topologySpreadConstraints"] = [{"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "ScheduleAnyway",
                                              "labelSelector": {"matchLabels": selector}}
                                             for key in ("kubernetes.io/hostname", "topology.kubernetes.io/zone")]
    if num_gpus:
        spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        affinity = node_affinity(source, settings)
        if affinity is not None:
            spec["affinity"] = affinity
    settings.extras.apply(spec, containers)
    return spec


def template_annotations(source: DeploySource, budget: Budgets,
                         settings: DeploySettings) -> dict[str, str]:
    """What a serving pod template says about itself for ``deploy check`` (its startup budget, the compute
    capability its checkpoint needs), and the secondary networks the cluster attaches (Multus)."""
    found = {BUDGET_ANNOTATION: str(budget.startup_s), **settings.extras.annotations()}
    needed = min_compute_capability(source)
    if needed is not None:
        found[MIN_CC_ANNOTATION] = f"{needed[0]}.{needed[1]}"
    return found
