"""Render a deployment into a kustomize-ready directory, validate it, and move it into place; re-check one."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trtllm_kit.build.staging import staged_dir
from trtllm_kit.deploy import autoscale, monitoring, multinode, objects
from trtllm_kit.deploy.dashboard import dashboard
from trtllm_kit.deploy.lints import lint
from trtllm_kit.deploy.objects import Names
from trtllm_kit.deploy.pod import budgets
from trtllm_kit.deploy.settings import DeploySettings
from trtllm_kit.deploy.source import DeploySource
from trtllm_kit.deploy.validate import KUBERNETES_VERSION, Finding, check_object, load_dir
from trtllm_kit.errors import KitError, KitUsageError
from trtllm_kit.targets import get_target

Obj = dict[str, Any]
RECORD = "trtllm-kit-deploy.json"


@dataclass(frozen=True)
class Rendered:
    """What ``deploy k8s`` wrote: the directory, its files (resources first) and the layout it chose."""

    out: Path
    resources: tuple[str, ...]
    extras: tuple[str, ...]
    num_nodes: int
    record: Obj

    def to_dict(self) -> Obj:
        return {"out": str(self.out), "resources": list(self.resources), "extras": list(self.extras),
                "num_nodes": self.num_nodes, **self.record}


def default_name(model: str) -> str:
    """A Kubernetes name from a model name (``builtin:tiny-llama`` → ``tiny-llama``)."""
    name = re.sub(r"[^a-z0-9]+", "-", model.rsplit(":", 1)[-1].rsplit("/", 1)[-1].lower()).strip("-")
    return (name or "model")[:40].rstrip("-")


def objects_for(source: DeploySource, settings: DeploySettings) -> tuple[dict[str, list[Obj]], dict[str, Any], int]:
    """(resource file → objects, extra file → content, nodes per replica) of a deployment.

    Arguments:
        source: the artifact; settings: the deployment.
    """
    names = Names(settings.name or default_name(source.model), settings.namespace)
    nodes = multinode.num_nodes(source, settings)
    if nodes > 1 and not get_target(source.target).process_per_rank:
        raise KitUsageError(f"a {source.target} artifact runs in one pod, but tp x pp = {source.world_size} ranks "
                            f"exceed {settings.gpus_per_node} GPUs per node; use nodes with more GPUs.")
    files: dict[str, list[Obj]] = {"sha256-configmap.yaml": [objects.sha256_list(names, source)]}
    if nodes == 1:
        files["deployment.yaml"] = [objects.deployment(names, source, settings)]
    else:
        files["leaderworkerset.yaml"] = [multinode.leader_worker_set(names, source, settings, nodes)]
        files["launch-configmap.yaml"] = [multinode.launch_config(names, source, settings, nodes)]
        files["rbac.yaml"] = multinode.rbac(names)
    files["service.yaml"] = [objects.service(names, settings)]
    files["poddisruptionbudget.yaml"] = [objects.disruption_budget(names)]
    files["podmonitor.yaml"] = [monitoring.pod_monitor(names)]
    files["prometheusrule.yaml"] = [monitoring.prometheus_rule(names)]
    extras: dict[str, Any] = {"dashboard.json": dashboard(names, settings)}
    if settings.autoscaler == "keda":
        files["scaledobject.yaml"] = [autoscale.scaled_object(names, settings, nodes > 1)]
    elif settings.autoscaler == "hpa":
        files["hpa.yaml"] = [autoscale.horizontal_pod_autoscaler(names, settings, nodes > 1)]
        extras["prometheus-adapter-values.yaml"] = monitoring.adapter_rules()
    return files, extras, nodes


def check(docs: list[tuple[str, Obj]], version: str = KUBERNETES_VERSION) -> list[Finding]:
    """Schema findings of every object, then the lints.

    Arguments:
        docs: (file, object) pairs; version: the Kubernetes version for core kinds.
    """
    found = [f for file, doc in docs for f in check_object(doc, file, version)]
    return found + lint(docs)


def render(source: DeploySource, settings: DeploySettings, out: Path, *, force: bool = False) -> Rendered:
    """Write the deployment of ``source`` into ``out`` (staged, validated, renamed into place).

    Arguments:
        source: the artifact; settings: the deployment; out: the directory; force: replace an existing one.
    """
    files, extras, nodes = objects_for(source, settings)
    docs = [(name, doc) for name, group in files.items() for doc in group]
    found = check(docs)
    if found:  # an internal invariant: the kit must never write an object its schemas refuse
        raise KitError(f"the generated objects fail validation: {found[0]}")
    budget = budgets(source, settings)
    record = {"name": settings.name or default_name(source.model), "namespace": settings.namespace,
              "kubernetes": KUBERNETES_VERSION, "target": source.target, "world_size": source.world_size,
              "tp_size": source.tp_size, "pp_size": source.pp_size, "startup_budget_s": budget.startup_s,
              "grace_period_s": budget.grace_s, "settings": settings.to_dict()}
    with staged_dir(out, force=force) as staging:
        for name, group in files.items():
            (staging / name).write_text(yaml.safe_dump_all(group, sort_keys=False))
        kustomization = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                         "resources": list(files)}
        (staging / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
        for name, content in extras.items():
            text = json.dumps(content, indent=2) + "\n" if name.endswith(".json") else \
                yaml.safe_dump(content, sort_keys=False)
            (staging / name).write_text(text)
        (staging / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return Rendered(out.absolute(), ("kustomization.yaml", *files), (*extras, RECORD), nodes, record)


def check_dir(directory: Path, version: str = KUBERNETES_VERSION) -> tuple[int, list[Finding]]:
    """(objects checked, findings) of a deploy directory after hand edits.

    Arguments:
        directory: a ``deploy k8s`` output; version: the Kubernetes version for core kinds.
    """
    docs = load_dir(directory)
    return len(docs), check(docs, version)
