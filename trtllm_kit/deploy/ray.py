"""``deploy ray``: an llmapi artifact as a KubeRay ``RayService`` (``ray.io/v1``).

``serveConfigV2`` holds one application, the model deployment of ``serve --ray`` (``ray_app.py``), with Ray Serve's
autoscaling from ``--replicas`` and ``--target-ongoing``. ``rayClusterConfig`` has a head group (no replicas on it:
``num-cpus`` 0) and one GPU worker group whose pods each hold one replica's GPUs and get the artifact as
``deploy k8s`` delivers it (the fetch init container, ``sha256sum -c`` against the manifest's list). Ray's own
autoscaler (``enableInTreeAutoscaling``) adds and removes worker pods for the replicas Serve asks for.

The HTTP entry is the kit's OpenAI frontend, the application's ingress deployment, in one replica on the head pod
(the head alone offers its custom resource) on ``--openai-port``; the Service ``NAME-api`` selects the head pod on
that port. The NetworkPolicy lets anyone reach that port, the cluster's own pods reach each other on every port
(Ray's GCS, raylets and object transfers), and the KubeRay operator reach the dashboard and Serve's proxy; both pod
templates and every container carry ``deploy k8s``'s security contexts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trtllm_kit.deploy import gateway, objects
from trtllm_kit.deploy.image import check_image
from trtllm_kit.deploy.objects import SERVICE_SUFFIX, Names
from trtllm_kit.deploy.pod import artifact_mounts, fetch_container, resources, security, volumes
from trtllm_kit.deploy.ray_app import IMPORT_PATH
from trtllm_kit.deploy.render import names_for, write_checked
from trtllm_kit.deploy.settings import DeploySettings
from trtllm_kit.deploy.source import DeploySource
from trtllm_kit.enums import Router
from trtllm_kit.errors import KitUsageError
from trtllm_kit.serve.ray.driver import APPLICATION, DEFAULT_MAX_ONGOING, DEPLOYMENT
from trtllm_kit.serve.ray.ingress import FRONTEND, FRONTEND_RESOURCE
from trtllm_kit.serve.ray.routing import router_config
from trtllm_kit.serve.ray.scaling import Autoscaling

Obj = dict[str, Any]
API_VERSION = "ray.io/v1"
WORKER_GROUP = "gpu"
SERVE_PORT = 8000  # Ray Serve's HTTP proxy on every node
DASHBOARD_PORT = 8265  # where the KubeRay operator submits the Serve config
GCS_PORT = 6379
OPERATOR = {"app.kubernetes.io/name": "kuberay-operator"}  # the KubeRay operator's pods, in any namespace
HEAD = {"ray.io/node-type": "head"}  # the label KubeRay gives the head pod
IDLE_TIMEOUT_S = 60  # Ray's autoscaler removes a worker pod idle this long
CPU_TAG_SUFFIX = "-cpu"  # rayproject/ray:2.60.0-py310-cpu


@dataclass(frozen=True)
class RayServiceWritten:
    """What ``deploy ray`` wrote: the directory, the RayService's name, its replicas and GPUs per replica."""

    out: Path
    name: str
    scaling: Autoscaling
    gpus_per_replica: int
    resources: tuple[str, ...]

    def to_dict(self) -> Obj:
        return {"out": str(self.out), "name": self.name, "resources": list(self.resources),
                "replicas": {"min": self.scaling.min_replicas, "max": self.scaling.max_replicas},
                "target_ongoing": self.scaling.target_ongoing, "gpus_per_replica": self.gpus_per_replica}


def check_ray(source: DeploySource, settings: DeploySettings) -> int:
    """GPUs per replica, after refusing what the GPU worker group cannot run.

    Arguments:
        source: the artifact; settings: the image and the node's GPUs.
    """
    if source.target != "llmapi":
        raise KitUsageError(f"the artifact's target is {source.target}; deploy ray serves llmapi artifacts on GPUs "
                            "(build with --target llmapi).")
    image = settings.image or ""
    tag = image.split("@", 1)[0].rsplit("/", 1)[-1].partition(":")[2]
    if tag.endswith(CPU_TAG_SUFFIX):
        raise KitUsageError(f"--image {image} is a CPU-only image ({CPU_TAG_SUFFIX} tag); give an image with CUDA, "
                            "Ray and the kit for the GPU worker group.")
    check_image(image, settings.image_trtllm_version, source.tensorrt_llm)
    gpus = source.tp_size * source.pp_size
    if gpus > settings.gpus_per_node:
        raise KitUsageError(f"a replica needs {gpus} GPUs (tp x pp) but --gpus-per-node is {settings.gpus_per_node};"
                            " deploy ray places one replica in one pod: use deploy k8s for replicas across nodes.")
    return gpus


def serve_config(source: DeploySource, scaling: Autoscaling, gpus: int, settings: DeploySettings) -> Obj:
    """``serveConfigV2``: the application, its frontend on the head, its model deployment, Ray Serve's autoscaling,
    the prefix router and each replica's GPUs.

    Arguments:
        source: the artifact (its mount path, max batch, name); scaling: replicas and target; gpus: GPUs per
        replica; settings: the frontend's port and the gateway's key Secret.
    """
    args: Obj = {"out": source.mount_path, "name": source.model, "port": settings.openai_port}
    if settings.api_keys_secret is not None:
        args |= {"api_keys": gateway.KEYS_PATH, "usage_log": gateway.USAGE_LOG}
    max_ongoing = max(source.max_batch_size or DEFAULT_MAX_ONGOING, math.ceil(scaling.target_ongoing))
    model: Obj = {"name": DEPLOYMENT, "max_ongoing_requests": max_ongoing, "autoscaling_config": scaling.ray_config(),
                  "ray_actor_options": {"num_cpus": 1, "num_gpus": gpus}}
    if source.tokens_per_block is not None:  # the prefix router, the default that measured better (docs/ray.md)
        model["request_router_config"] = router_config(Router.PREFIX, source.tokens_per_block)
    return {"applications": [{
        "name": APPLICATION, "import_path": IMPORT_PATH, "route_prefix": None,
        "args": args,
        "deployments": [{"name": FRONTEND, "num_replicas": 1,
                         "ray_actor_options": {"num_cpus": 0, "resources": {FRONTEND_RESOURCE: 1}}},
                        model]}]}


def head_group(names: Names, settings: DeploySettings) -> Obj:
    """The head: GCS, the Serve controller and proxy, and the frontend (the one pod with its resource) with the
    gateway's key Secret and usage log sidecar when ``--api-keys-secret`` is given (``deploy/gateway.py``);
    ``num-cpus`` 0 so that no model replica lands on it.

    Arguments:
        names: the service (the pod's labels); settings: the image, the OpenAI port, the key Secret.
    """
    pod_security, container_security = security()
    container = {"name": "ray-head", "image": settings.image,
                 "resources": {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"cpu": "2", "memory": "8Gi"}},
                 "ports": [{"name": "gcs", "containerPort": GCS_PORT},
                           {"name": "dashboard", "containerPort": DASHBOARD_PORT},
                           {"name": "serve", "containerPort": SERVE_PORT},
                           {"name": "openai", "containerPort": settings.openai_port}],
                 "securityContext": container_security}
    spec: Obj = {"containers": [container], "securityContext": pod_security}
    if settings.api_keys_secret is not None:
        container["volumeMounts"] = gateway.mounts(settings)
        spec |= {"initContainers": gateway.usage_sidecar(settings, container_security),
                 "volumes": gateway.volumes(settings)}
    return {"rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0"},
            "resources": {FRONTEND_RESOURCE: "1"},
            "template": {"metadata": {"labels": {**names.labels, **HEAD}},  # KubeRay sets HEAD too
                         "spec": spec}}


def worker_group(names: Names, source: DeploySource, settings: DeploySettings, scaling: Autoscaling,
                 gpus: int) -> Obj:
    """The GPU worker group: one replica's GPUs per pod, the artifact fetched and checked before Ray starts.

    Arguments:
        names: the service; source: the artifact; settings: delivery and image; scaling: the group's bounds;
        gpus: GPUs per pod.
    """
    pod_security, container_security = security()
    container = {"name": "ray-worker", "image": settings.image, "resources": resources(source, gpus, gpus, settings),
                 "volumeMounts": [*artifact_mounts(source, settings), {"name": "dshm", "mountPath": "/dev/shm"}],
                 "securityContext": container_security}
    spec: Obj = {"initContainers": [fetch_container(source, settings)], "containers": [container],
                 "securityContext": pod_security, "volumes": volumes(names.name, source, settings, gpus),
                 "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
    settings.extras.apply(spec, [container])
    template: Obj = {"metadata": {"labels": dict(names.labels)}, "spec": spec}
    if settings.extras.annotations():
        template["metadata"]["annotations"] = settings.extras.annotations()
    return {"groupName": WORKER_GROUP, "replicas": scaling.min_replicas, "minReplicas": scaling.min_replicas,
            "maxReplicas": scaling.max_replicas, "rayStartParams": {"num-cpus": str(max(4, gpus))},
            "template": template}


def ray_service(names: Names, source: DeploySource, settings: DeploySettings, scaling: Autoscaling,
                gpus: int) -> Obj:
    """The ``RayService``: the Serve config and the cluster, Ray's autoscaler on."""
    cluster = {"enableInTreeAutoscaling": True,
               "autoscalerOptions": {"idleTimeoutSeconds": IDLE_TIMEOUT_S, "upscalingMode": "Default"},
               "headGroupSpec": head_group(names, settings),
               "workerGroupSpecs": [worker_group(names, source, settings, scaling, gpus)]}
    return {"apiVersion": API_VERSION, "kind": "RayService", "metadata": names.meta(),
            "spec": {"serveConfigV2": yaml.safe_dump(serve_config(source, scaling, gpus, settings), sort_keys=False),
                     "rayClusterConfig": cluster}}


def frontend_service(names: Names, settings: DeploySettings) -> Obj:
    """The clients' Service ``NAME-api``: the head pod's OpenAI port, where the frontend listens.

    Arguments:
        names: the service; settings: the OpenAI port.
    """
    return {"apiVersion": "v1", "kind": "Service", "metadata": names.meta(SERVICE_SUFFIX),
            "spec": {"type": "ClusterIP", "selector": {"app": names.name, **HEAD},
                     "ports": [{"name": "openai", "port": settings.openai_port, "targetPort": "openai"}]}}


def network_policy(names: Names, settings: DeploySettings) -> Obj:
    """Ingress to the cluster's pods: the OpenAI port from anywhere, every port from the cluster's own pods, the
    dashboard and Serve's proxy from the KubeRay operator; nothing else (egress stays open: the artifact fetch, DNS).

    Arguments:
        names: the service; settings: the OpenAI port.
    """
    own = {"podSelector": {"matchLabels": {"app": names.name}}}
    operator = {"namespaceSelector": {}, "podSelector": {"matchLabels": dict(OPERATOR)}}
    rules = [{"ports": [{"protocol": "TCP", "port": settings.openai_port}]}, {"from": [own]},
             {"from": [operator],
              "ports": [{"protocol": "TCP", "port": port} for port in (DASHBOARD_PORT, SERVE_PORT)]}]
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": names.meta(),
            "spec": {**own, "policyTypes": ["Ingress"], "ingress": rules}}


def render_ray(source: DeploySource, settings: DeploySettings, scaling: Autoscaling, out: Path, *,
               force: bool = False) -> RayServiceWritten:
    """Write the RayService of ``source`` into ``out`` (kustomize), validated before it is moved into place.

    Arguments:
        source: the artifact; settings: the deployment; scaling: replicas and target; out: the directory;
        force: replace an existing one.
    """
    gpus = check_ray(source, settings)
    names = names_for(source, settings)
    files: dict[str, list[Obj]] = {"sha256-configmap.yaml": [objects.sha256_list(names, source)],
                                   "rayservice.yaml": [ray_service(names, source, settings, scaling, gpus)],
                                   "service.yaml": [frontend_service(names, settings)],
                                   "networkpolicy.yaml": [network_policy(names, settings)]}
    written = write_checked(files, out, settings.versions, force=force)
    return RayServiceWritten(out.absolute(), names.name, scaling, gpus, written)
