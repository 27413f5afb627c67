"""``deploy dynamo``: an llmapi artifact as a Dynamo ``DynamoGraphDeployment`` (``nvidia.com/v1beta1``).

The graph has a ``Frontend`` and the TensorRT-LLM workers by role (``dynamo_roles``). The frontend routes by cached
prefix (``--router-mode kv``, upstream's ``agg_router.yaml``) and moves a stream whose worker dies
(``--migration-limit``, ``serve --dynamo``'s defaults); the workers publish their KV cache events. Every worker pod
gets the artifact as ``deploy k8s`` delivers it (the fetch init container, ``sha256sum -c`` against the manifest's
list) and its role's engine options from a ConfigMap. The Dynamo operator adds the ports (frontend ``http`` 8000,
worker ``system`` 9090), probes, ``/dev/shm`` (sized here: ``shm_per_rank`` per GPU) and, across nodes, the
``mpirun`` launch; the PodMonitor scrapes those ports' ``/metrics``; the dashboard is a ConfigMap for Grafana's
sidecar.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from trtllm_kit.deploy import dynamo_scaling, monitoring, objects
from trtllm_kit.deploy.dashboard import dashboard_config_map
from trtllm_kit.deploy.dynamo_dashboard import dashboard
from trtllm_kit.deploy.dynamo_roles import OPTIONS_DIR, WORKER_MODULE, Role, engine_options, worker_args
from trtllm_kit.deploy.objects import Names
from trtllm_kit.deploy.pod import artifact_mounts, fetch_container, resources, shm_size, volumes
from trtllm_kit.deploy.render import names_for, write_checked
from trtllm_kit.deploy.serving import Serving
from trtllm_kit.deploy.settings import DeploySettings
from trtllm_kit.deploy.source import DeploySource
from trtllm_kit.serve.dynamo.launch import router_args
from trtllm_kit.spec import ServeSettings

Obj = dict[str, Any]
API_VERSION = "nvidia.com/v1beta1"
FRONTEND_PORT = 8000
FRONTEND_MODULE = ("python3", "-m", "dynamo.frontend")
MAIN = "main"  # the container the operator fills in
MULTINODE_ENV = (("OMPI_ALLOW_RUN_AS_ROOT", "1"), ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"))
DYNAMO = Serving("dynamo", "/health", "/live", "system", ("http", "system"),
                 (("http", "/metrics"), ("system", "/metrics")), "dynamo_frontend_queued_requests{$sel}")


@dataclass(frozen=True)
class Graph:
    """A rendered graph: its name, the worker roles, and the files written."""

    out: Path
    name: str
    roles: tuple[Role, ...]
    resources: tuple[str, ...]

    def to_dict(self) -> Obj:
        return {"out": str(self.out), "name": self.name, "resources": list(self.resources),
                "roles": [{"name": r.name, "type": r.type, "replicas": r.replicas, "tp_size": r.tp_size,
                           "pp_size": r.pp_size} for r in self.roles]}


def model_path(source: DeploySource) -> str:
    """The checkpoint's path in the pod: the one the recorded ``trtllm-serve`` command serves."""
    return source.serve_command[1] if len(source.serve_command) > 1 else str(PurePosixPath(source.mount_path) /
                                                                              "checkpoint")


def options_config(names: Names, source: DeploySource, roles: tuple[Role, ...]) -> Obj:
    """A ConfigMap holding every role's engine options file."""
    data = {role.options_file: yaml.safe_dump(engine_options(source, role), sort_keys=False) for role in roles}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": names.meta("-engine"), "data": data}


def _template(names: Names, container: Obj, spec: Obj | None = None) -> Obj:
    return {"metadata": {"labels": {**names.labels, **names.serving}},
            "spec": {**(spec or {}), "containers": [container]}}


def worker_component(names: Names, source: DeploySource, settings: DeploySettings, role: Role) -> Obj:
    """One worker role: ``dynamo.trtllm`` in ``main``, the artifact fetched and checked, its engine options.

    Arguments:
        names: the graph; source: the artifact; settings: delivery, image, GPUs per node; role: the role.
    """
    gpus = role.gpus_per_pod(settings.gpus_per_node)
    container = {"name": MAIN, "image": settings.image, "command": list(WORKER_MODULE),
                 "args": worker_args(source, role, model_path(source)),
                 "resources": resources(source, gpus, gpus, settings),
                 "volumeMounts": [*artifact_mounts(source, settings),
                                  {"name": "engine", "mountPath": OPTIONS_DIR, "readOnly": True}]}
    pod_volumes = [v for v in volumes(names.name, source, settings, gpus) if v["name"] != "dshm"]
    pod_volumes.append({"name": "engine", "configMap": {"name": f"{names.name}-engine"}})
    spec = {"initContainers": [fetch_container(source, settings)], "volumes": pod_volumes,
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
    settings.extras.apply(spec, [container])
    template = _template(names, container, spec)
    if settings.extras.annotations():
        template["metadata"]["annotations"] = settings.extras.annotations()
    component: Obj = {"name": role.name, "type": role.type, "replicas": role.replicas, "podTemplate": template,
                      "sharedMemorySize": shm_size(settings, gpus)}  # the operator's /dev/shm (its default 8Gi)
    nodes = role.num_nodes(settings.gpus_per_node)
    if nodes > 1:
        component["multinode"] = {"nodeCount": nodes}
    if dynamo_scaling.check_autoscaler(settings):
        component["scalingAdapter"] = {}
    return component


def frontend_args() -> list[str]:
    """``dynamo.frontend``'s arguments: its port, KV-aware routing (with ``serve --dynamo``'s overlap credit) and
    migration at ``serve --dynamo``'s defaults."""
    serve = ServeSettings()
    return ["--http-port", str(FRONTEND_PORT), *router_args(serve.router),
            "--migration-limit", str(serve.migration_limit)]


def frontend_component(names: Names, settings: DeploySettings) -> Obj:
    """The OpenAI frontend (``dynamo.frontend``), one replica."""
    container = {"name": MAIN, "image": settings.image, "command": list(FRONTEND_MODULE), "args": frontend_args()}
    return {"name": "Frontend", "type": "frontend", "replicas": 1, "podTemplate": _template(names, container)}


def graph_deployment(names: Names, source: DeploySource, settings: DeploySettings, roles: tuple[Role, ...]) -> Obj:
    """The ``DynamoGraphDeployment``: frontend and workers; spec-level MPI env when a role spans nodes."""
    spec: Obj = {"backendFramework": "trtllm",
                 "components": [frontend_component(names, settings),
                                *(worker_component(names, source, settings, role) for role in roles)]}
    if any(role.num_nodes(settings.gpus_per_node) > 1 for role in roles):
        spec["env"] = [{"name": key, "value": value} for key, value in MULTINODE_ENV]
    return {"apiVersion": API_VERSION, "kind": "DynamoGraphDeployment", "metadata": names.meta(), "spec": spec}


def render_graph(source: DeploySource, settings: DeploySettings, roles: tuple[Role, ...], out: Path, *,
                 force: bool = False) -> Graph:
    """Write the graph of ``source`` into ``out`` (kustomize), validated before it is moved into place.

    Arguments:
        source: the artifact; settings: the deployment; roles: the worker roles; out: the directory;
        force: replace an existing one.
    """
    names = names_for(source, settings)
    files: dict[str, list[Obj]] = {
        "sha256-configmap.yaml": [objects.sha256_list(names, source)],
        "engine-configmap.yaml": [options_config(names, source, roles)],
        "dynamographdeployment.yaml": [graph_deployment(names, source, settings, roles)],
        "podmonitor.yaml": [monitoring.pod_monitor(names, settings.monitor_labels, DYNAMO)],
        "dashboard-configmap.yaml": [dashboard_config_map(names, dashboard(names))]}
    if dynamo_scaling.check_autoscaler(settings):
        files["scaledobjects.yaml"] = [dynamo_scaling.scaled_object(names, source, settings, role) for role in roles]
    written = write_checked(files, out, settings.versions, force=force)
    return Graph(out.absolute(), names.name, roles, written)
