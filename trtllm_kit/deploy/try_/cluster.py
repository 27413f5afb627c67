"""What the cluster makes of a deploy directory: the pods of its workload, its ConfigMaps and Secrets, its Services
and the names they resolve.

The LeaderWorkerSet is modelled as its controller behaves (kubernetes-sigs/lws): group *g* has a leader pod
``<lws>-<g>`` and workers ``<lws>-<g>-<i>``, each with the labels and the ``LWS_*`` variables the controller sets;
their DNS names ``<pod>.<lws>.<namespace>`` exist only in the group's headless Service, which the controller creates
only if no Service of the LeaderWorkerSet's own name exists (``CreateHeadlessServiceIfNotExists(lws.Name)``).
"""

from __future__ import annotations

import base64
import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trtllm_kit.deploy.validate import load_dir
from trtllm_kit.errors import KitUsageError

Obj = dict[str, Any]
LWS_LABELS = ("leaderworkerset.sigs.k8s.io/name", "leaderworkerset.sigs.k8s.io/group-index",
              "leaderworkerset.sigs.k8s.io/worker-index", "leaderworkerset.sigs.k8s.io/group-key")


@dataclass(frozen=True)
class PodPlan:
    """One pod: its name, labels, spec, the variables a controller injects, and its DNS subdomain (if any)."""

    name: str
    labels: dict[str, str]
    spec: Obj
    injected_env: dict[str, str] = field(default_factory=dict)
    subdomain: str | None = None


@dataclass(frozen=True)
class ServicePlan:
    """A Service: name, selector, ports (name, port, targetPort) and whether it is headless."""

    name: str
    selector: dict[str, str]
    ports: tuple[tuple[str, int, int | str], ...]
    headless: bool = False


@dataclass(frozen=True)
class Cluster:
    """The objects of one deploy directory as the cluster would hold them."""

    namespace: str
    pods: tuple[PodPlan, ...]
    services: tuple[ServicePlan, ...]
    config_maps: dict[str, dict[str, bytes]]
    secrets: dict[str, dict[str, bytes]]
    notes: tuple[str, ...] = ()

    def hostnames(self, pod: PodPlan) -> list[str]:
        """The names a pod's own address answers to: its name, and in a subdomain the names the headless Service
        of that subdomain gives it (only if the cluster made that Service)."""
        names = [pod.name]
        if pod.subdomain and any(s.name == pod.subdomain and s.headless for s in self.services):
            base = f"{pod.name}.{pod.subdomain}.{self.namespace}"
            names += [f"{pod.name}.{pod.subdomain}", base, f"{base}.svc", f"{base}.svc.cluster.local"]
        return names

    def service_names(self, service: ServicePlan) -> list[str]:
        base = f"{service.name}.{self.namespace}"
        return [service.name, base, f"{base}.svc", f"{base}.svc.cluster.local"]


def _data(doc: Obj) -> dict[str, bytes]:
    found = {k: str(v).encode() for k, v in (doc.get("data") or {}).items()}
    if doc.get("kind") == "Secret":
        found = {k: base64.b64decode(v) for k, v in (doc.get("data") or {}).items()}
        found.update({k: str(v).encode() for k, v in (doc.get("stringData") or {}).items()})
    else:
        found.update({k: base64.b64decode(v) for k, v in (doc.get("binaryData") or {}).items()})
    return found


def _generated_secrets(directory: Path) -> dict[str, dict[str, bytes]]:
    """The Secrets a kustomize ``secretGenerator`` makes from files (names kept: the kit disables the hash)."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text()) or {}
    found = {}
    for entry in kustomization.get("secretGenerator") or []:
        files = {}
        for item in entry.get("files") or []:
            key, _, path = str(item).rpartition("=") if "=" in str(item) else ("", "", str(item))
            files[key or Path(path).name] = (directory / path).read_bytes()
        found[entry["name"]] = files
    return found


def _deployment_pods(doc: Obj, replicas: int) -> list[PodPlan]:
    template = doc["spec"]["template"]
    name = doc["metadata"]["name"]
    return [PodPlan(f"{name}-{index}", dict(template["metadata"].get("labels") or {}), copy.deepcopy(template["spec"]))
            for index in range(replicas)]


def _group_pods(doc: Obj, replicas: int, namespace: str) -> list[PodPlan]:
    """A LeaderWorkerSet's pods, named, labelled and given the variables its controller injects."""
    name = doc["metadata"]["name"]
    group = doc["spec"]["leaderWorkerTemplate"]
    size = int(group.get("size", 1))
    pods = []
    for g in range(replicas):
        for index in range(size):
            template = group["leaderTemplate" if index == 0 and "leaderTemplate" in group else "workerTemplate"]
            pod = name + (f"-{g}" if index == 0 else f"-{g}-{index}")
            labels = {**(template.get("metadata") or {}).get("labels", {}),
                      **dict(zip(LWS_LABELS, (name, str(g), str(index), f"{name}-{g}"), strict=True))}
            env = {"LWS_LEADER_ADDRESS": f"{name}-{g}.{name}.{namespace}", "LWS_GROUP_SIZE": str(size),
                   "LWS_WORKER_INDEX": str(index), "LWS_NAME": name}
            pods.append(PodPlan(pod, labels, copy.deepcopy(template["spec"]), env, subdomain=name))
    return pods


def read_cluster(directory: Path, replicas: int = 1) -> Cluster:
    """The cluster's view of a ``deploy k8s`` directory, ``replicas`` replicas (pods, or groups) of its workload.

    Arguments:
        directory: the kustomize directory; replicas: how many replicas to run.
    """
    docs = [doc for _, doc in load_dir(directory)]
    workloads = [d for d in docs if d.get("kind") in ("Deployment", "LeaderWorkerSet")]
    if len(workloads) != 1:
        raise KitUsageError(f"{directory} holds {len(workloads)} Deployments or LeaderWorkerSets; deploy try runs a "
                            "directory written by trtllm-kit deploy k8s, which holds one.")
    [workload] = workloads
    namespace = str(workload["metadata"].get("namespace") or "default")
    notes = []
    services = [ServicePlan(d["metadata"]["name"], dict((d.get("spec") or {}).get("selector") or {}),
                            tuple((str(p.get("name", "")), int(p["port"]), p.get("targetPort", p["port"]))
                                  for p in (d.get("spec") or {}).get("ports") or []),
                            (d.get("spec") or {}).get("clusterIP") == "None")
                for d in docs if d.get("kind") == "Service"]
    if workload["kind"] == "LeaderWorkerSet":
        pods = _group_pods(workload, replicas, namespace)
        lws = workload["metadata"]["name"]
        if any(s.name == lws for s in services):
            notes.append(f"Service {lws} has the LeaderWorkerSet's name, so its controller creates no headless "
                         f"Service: the group's names <pod>.{lws}.{namespace} do not resolve")
        else:
            services.append(ServicePlan(lws, {LWS_LABELS[0]: lws}, (), headless=True))
    else:
        pods = _deployment_pods(workload, replicas)
    return Cluster(namespace, tuple(pods), tuple(services),
                   {d["metadata"]["name"]: _data(d) for d in docs if d.get("kind") == "ConfigMap"},
                   {**{d["metadata"]["name"]: _data(d) for d in docs if d.get("kind") == "Secret"},
                    **_generated_secrets(directory)}, tuple(notes))
