"""Render a deployment into a kustomize-ready directory, validate it, and move it into place; re-check one."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trtllm_kit.build.staging import staged_dir
from trtllm_kit.deploy import autoscale, monitoring, multinode, objects, router
from trtllm_kit.deploy.alerts import alerts
from trtllm_kit.deploy.dashboard import dashboard, dashboard_config_map
from trtllm_kit.deploy.image import check_image
from trtllm_kit.deploy.lints import lint
from trtllm_kit.deploy.objects import Names
from trtllm_kit.deploy.scale_to_zero import http_scaled_object
from trtllm_kit.deploy.serving import serving_for
from trtllm_kit.deploy.settings import DeploySettings
from trtllm_kit.deploy.source import DeploySource
from trtllm_kit.deploy.startup import budgets
from trtllm_kit.deploy.validate import Finding, check_object, load_dir
from trtllm_kit.deploy.versions import KEDA_DEFAULT, KUBERNETES_DEFAULT, Versions, version_findings
from trtllm_kit.errors import KitError

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


def names_for(source: DeploySource, settings: DeploySettings) -> Names:
    """The deployment's name (``--name``, else from the model) and namespace."""
    return Names(settings.name or default_name(source.model), settings.namespace)


def objects_for(source: DeploySource, settings: DeploySettings) -> tuple[dict[str, list[Obj]], dict[str, Any], int]:
    """(resource file → objects, extra file → content, nodes per replica) of a deployment.

    Arguments:
        source: the artifact; settings: the deployment.
    """
    names = names_for(source, settings)
    assert settings.image is not None, "DeploySettings requires an image"
    check_image(settings.image, settings.image_trtllm_version, source.tensorrt_llm)
    nodes = multinode.num_nodes(source, settings)
    files: dict[str, list[Obj]] = {"sha256-configmap.yaml": [objects.sha256_list(names, source)]}
    if nodes == 1:
        files["deployment.yaml"] = [objects.deployment(names, source, settings)]
    else:
        files["leaderworkerset.yaml"] = [multinode.leader_worker_set(names, source, settings, nodes)]
        files["launch-configmap.yaml"] = [multinode.launch_config(names, source, settings, nodes)]
    files["service.yaml"] = [objects.service(names, settings)]
    files["networkpolicy.yaml"] = [objects.network_policy(names, nodes)]
    files["poddisruptionbudget.yaml"] = [objects.disruption_budget(names)]
    serving = serving_for(source, settings, nodes)
    files["podmonitor.yaml"] = [monitoring.pod_monitor(names, settings.monitor_labels, serving)]
    alert_rules = [a.rule() for a in alerts(names, serving, settings.queue_target, settings.ttft_slo_s)]
    files["prometheusrule.yaml"] = [monitoring.prometheus_rule(names, settings.monitor_labels, serving, alert_rules)]
    files["dashboard-configmap.yaml"] = [dashboard_config_map(names, dashboard(names, settings))]
    extras: dict[str, Any] = {}
    if settings.router == "inference-extension":
        server = router.model_server(serving)
        files["inferencepool.yaml"] = [router.inference_pool(names, settings)]
        files["httproute.yaml"] = [router.http_route(names, settings)]
        extras["endpoint-picker-values.yaml"] = router.endpoint_picker_values(names, settings, server)
    if settings.min_replicas == 0:
        files["httpscaledobject.yaml"] = [http_scaled_object(names, source, settings,
                                                             budgets(source, settings, nodes).startup_s, nodes > 1)]
    elif settings.autoscaler == "keda":
        files["scaledobject.yaml"] = [autoscale.scaled_object(names, settings, nodes > 1, serving)]
    elif settings.autoscaler == "hpa":
        files["hpa.yaml"] = [autoscale.horizontal_pod_autoscaler(names, settings, nodes > 1)]
        extras["prometheus-adapter-values.yaml"] = monitoring.adapter_rules()
    return files, extras, nodes


def check(docs: list[tuple[str, Obj]], versions: Versions | None = None) -> list[Finding]:
    """Schema findings of every object, then the lints, then the features the cluster's versions cannot run.

    Arguments:
        docs: (file, object) pairs; versions: the cluster's Kubernetes (schemas of core kinds) and KEDA versions.
    """
    versions = versions or Versions.parse(KUBERNETES_DEFAULT, KEDA_DEFAULT)
    found = [f for file, doc in docs for f in check_object(doc, file, versions.kubernetes_text)]
    return found + lint(docs) + version_findings(docs, versions)


def write_checked(files: dict[str, list[Obj]], out: Path, versions: Versions, *,
                  force: bool = False) -> tuple[str, ...]:
    """Check ``files`` and write them with their kustomization into ``out`` (staged, renamed into place); the names
    written, the kustomization first.

    Arguments:
        files: file name → its objects; out: the directory; versions: the cluster's; force: replace an existing one.
    """
    found = check([(name, doc) for name, group in files.items() for doc in group], versions)
    if found:  # an internal invariant: the kit must never write an object its schemas refuse
        raise KitError(f"the generated objects fail validation: {found[0]}")
    with staged_dir(out, force=force) as staging:
        for name, group in files.items():
            (staging / name).write_text(yaml.safe_dump_all(group, sort_keys=False))
        (staging / "kustomization.yaml").write_text(yaml.safe_dump(
            {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": list(files)},
            sort_keys=False))
    return ("kustomization.yaml", *files)


def render(source: DeploySource, settings: DeploySettings, out: Path, *, force: bool = False) -> Rendered:
    """Write the deployment of ``source`` into ``out`` (staged, validated, renamed into place).

    Arguments:
        source: the artifact; settings: the deployment; out: the directory; force: replace an existing one.
    """
    files, extras, nodes = objects_for(source, settings)
    docs = [(name, doc) for name, group in files.items() for doc in group]
    found = check(docs, settings.versions)
    if found:  # an internal invariant: the kit must never write an object its schemas refuse
        raise KitError(f"the generated objects fail validation: {found[0]}")
    budget = budgets(source, settings, nodes)
    names = names_for(source, settings)
    record = {"name": names.name, "namespace": names.namespace, "service": names.service,
              "kubernetes": settings.versions.kubernetes_text, "keda": settings.keda_version,
              "target": source.target, "world_size": source.world_size,
              "tp_size": source.tp_size, "pp_size": source.pp_size, "startup_budget_s": budget.startup_s,
              "startup": {"read_s": budget.read_s, "fixed_s": budget.fixed_s, "wait_s": budget.wait_s},
              "grace_period_s": budget.grace_s, "settings": settings.to_dict()}
    with staged_dir(out, force=force) as staging:
        for name, group in files.items():
            (staging / name).write_text(yaml.safe_dump_all(group, sort_keys=False))
        kustomization: Obj = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                              "resources": list(files)}
        generated: tuple[str, ...] = ()
        if nodes > 1 and settings.ssh_secret is None:
            multinode.write_key_pair(staging)
            kustomization["secretGenerator"] = [multinode.secret_generator(names)]
            generated = multinode.SSH_FILES
        (staging / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
        for name, content in extras.items():
            text = json.dumps(content, indent=2) + "\n" if name.endswith(".json") else \
                yaml.safe_dump(content, sort_keys=False)
            (staging / name).write_text(text)
        (staging / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return Rendered(out.absolute(), ("kustomization.yaml", *files), (*extras, RECORD, *generated), nodes, record)


def check_dir(directory: Path, kubernetes: str | None = None, keda: str | None = None) -> tuple[int, list[Finding]]:
    """(objects checked, findings) of a deploy directory after hand edits.

    Arguments:
        directory: a ``deploy k8s`` output; kubernetes, keda: the cluster's versions (``dir_versions``).
    """
    docs = load_dir(directory)
    return len(docs), check(docs, dir_versions(directory, kubernetes, keda))


def dir_versions(directory: Path, kubernetes: str | None = None, keda: str | None = None) -> Versions:
    """The versions a deploy directory is checked against: those given, else those it was written for, else the
    kit's defaults.

    Arguments:
        directory: a deploy output; kubernetes, keda: versions the user states (None: not stated).
    """
    record = _record(directory)
    return Versions.parse(kubernetes or record.get("kubernetes") or KUBERNETES_DEFAULT,
                          keda or record.get("keda") or KEDA_DEFAULT)


def _record(directory: Path) -> Obj:
    """The directory's ``RECORD`` (what ``deploy k8s`` wrote it for), or nothing when absent or unreadable."""
    try:
        found = json.loads((directory / RECORD).read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}
