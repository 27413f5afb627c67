"""The kit's own checks of a deploy directory, beyond the schemas: budgets, selectors, scaling targets."""

from __future__ import annotations

import json
import re
from typing import Any

from trtllm_kit.deploy.dashboard import SIDECAR_LABEL
from trtllm_kit.deploy.launch import LAUNCH_SUFFIX, PLAN_FILE
from trtllm_kit.deploy.network_lints import unreachable_ports
from trtllm_kit.deploy.placement import check_compute_capability
from trtllm_kit.deploy.scale_to_zero import condition_wait_s
from trtllm_kit.deploy.startup import BUDGET_ANNOTATION
from trtllm_kit.deploy.validate import Finding

Obj = dict[str, Any]
WORKLOADS = ("Deployment", "LeaderWorkerSet", "DynamoGraphDeployment", "RayService")


def _pod_templates(doc: Obj) -> list[Obj]:
    spec = doc.get("spec") or {}
    if doc.get("kind") == "Deployment":
        return [spec.get("template") or {}]
    if doc.get("kind") == "DynamoGraphDeployment":
        return [component.get("podTemplate") or {} for component in spec.get("components") or []]
    if doc.get("kind") == "RayService":  # the head (where deploy ray's frontend serves), then the worker groups
        cluster = spec.get("rayClusterConfig") or {}
        return [(cluster.get("headGroupSpec") or {}).get("template") or {},
                *((group.get("template") or {}) for group in cluster.get("workerGroupSpecs") or [])]
    group = spec.get("leaderWorkerTemplate") or {}
    return [group.get("leaderTemplate") or {}, group.get("workerTemplate") or {}]


def _flag(container: Obj, pattern: str) -> int | None:
    text = " ".join(str(a) for a in [*(container.get("command") or []), *(container.get("args") or [])])
    found = re.search(pattern + r"[= ](\d+)", text)
    return int(found.group(1)) if found else None


def _exit_timeout(container: Obj) -> int | None:
    return _flag(container, r"--exit-timeout(?:-secs)?")


def _allowed(probe: Obj) -> int:
    """Seconds a startupProbe allows before the kubelet restarts the container."""
    return probe.get("initialDelaySeconds", 0) + probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)


def _leader_plan(file: str, name: str, data: Obj, workloads: dict[tuple[Any, Any], tuple[str, Obj]]) -> list[Finding]:
    """A multi-node leader's plan whose deadlines the leader's startupProbe does not cover."""
    try:
        plan = json.loads(data[PLAN_FILE])
        startup_s, wait_s = int(plan["startup_s"]), int(plan["worker_wait_s"])
    except (ValueError, KeyError, TypeError) as exc:
        return [Finding(file, "ConfigMap", name, f"data/{PLAN_FILE}", f"is not a leader plan ({exc}); regenerate it "
                        "with trtllm-kit deploy k8s")]
    found = []
    if wait_s >= startup_s:
        found.append(Finding(file, "ConfigMap", name, f"data/{PLAN_FILE}", f"worker_wait_s {wait_s} leaves nothing of "
                             f"startup_s {startup_s} for loading; keep the wait inside the budget"))
    _, lws = workloads.get(("LeaderWorkerSet", name.removesuffix(LAUNCH_SUFFIX)), ("", {}))
    for template in _pod_templates(lws)[:1] if lws else []:
        for container in (template.get("spec") or {}).get("containers") or []:
            probe = container.get("startupProbe")
            if probe is not None and _allowed(probe) < startup_s:
                found.append(Finding(file, "ConfigMap", name, f"data/{PLAN_FILE}", f"the leader may take startup_s "
                                     f"{startup_s} s, but its startupProbe allows {_allowed(probe)} s; raise "
                                     "the probe's failureThreshold or lower startup_s"))
    return found


def _startup(file: str, doc: Obj, template: Obj) -> list[Finding]:
    """A startupProbe shorter than the pod's startup budget, or than the server's own ``--ready-timeout``."""
    budget = ((template.get("metadata") or {}).get("annotations") or {}).get(BUDGET_ANNOTATION)
    found = []
    for container in (template.get("spec") or {}).get("containers") or []:
        probe = container.get("startupProbe")
        if probe is None:
            continue
        allowed = _allowed(probe)
        wanted = [(int(budget), f"the startup budget ({BUDGET_ANNOTATION})")] if budget else []
        ready = _flag(container, "--ready-timeout")
        wanted += [(ready, "the server's --ready-timeout")] if ready is not None else []
        for seconds, what in wanted:
            if allowed < seconds:
                found.append(Finding(file, doc["kind"], doc["metadata"]["name"], "startupProbe",
                                     f"allows {allowed} s, less than {what} of {seconds} s: the kubelet would kill "
                                     f"a server that is still loading; raise failureThreshold to "
                                     f"{-(-seconds // probe.get('periodSeconds', 10))}"))
    return found


def _drain_s(pre_stop: Obj) -> int:
    """Seconds a preStop handler waits: the ``sleep`` action, or ``sleep N`` run in the container."""
    if "sleep" in pre_stop:
        return int((pre_stop.get("sleep") or {}).get("seconds", 0))
    command = [str(a) for a in (pre_stop.get("exec") or {}).get("command") or []]
    return int(command[1]) if len(command) == 2 and command[0] == "sleep" and command[1].isdigit() else 0


def _grace(file: str, doc: Obj, template: Obj) -> list[Finding]:
    spec = template.get("spec") or {}
    grace = spec.get("terminationGracePeriodSeconds", 30)
    found = []
    for container in spec.get("containers") or []:
        timeout = _exit_timeout(container)
        drain = _drain_s((container.get("lifecycle") or {}).get("preStop") or {})
        if timeout is not None and grace <= timeout + drain:
            found.append(Finding(file, doc["kind"], doc["metadata"]["name"], "terminationGracePeriodSeconds",
                                 f"{grace} s does not cover the preStop drain ({drain} s) plus the server's exit "
                                 f"timeout ({timeout} s); raise it above {timeout + drain} s"))
    return found


LINKED_COPY = re.compile(r"\b(?:cp\s+-\w*s\w*|ln\s+-\w*s\w*)\s+(/\S+)")  # cp -rs SRC, ln -s SRC


def _mounts(container: Obj) -> list[Obj]:
    return list(container.get("volumeMounts") or [])


def _dangling_links(file: str, doc: Obj, template: Obj) -> list[Finding]:
    """A container reading a volume that an init container filled with links into another volume, without that
    other volume mounted at the same path: every link dangles in it (``--pvc``: links into the claim)."""
    spec = template.get("spec") or {}
    found = []
    for init in spec.get("initContainers") or []:
        text = " ".join(str(a) for a in [*(init.get("command") or []), *(init.get("args") or [])])
        sources = LINKED_COPY.findall(text)
        targets = {(m.get("name"), m.get("mountPath")) for m in _mounts(init) if m.get("readOnly")
                   and any(str(src).startswith(str(m.get("mountPath")).rstrip("/") + "/") for src in sources)}
        written = {m.get("name") for m in _mounts(init) if not m.get("readOnly")}
        for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
            if container is init or not written & {m.get("name") for m in _mounts(container)}:
                continue
            has = {(m.get("name"), m.get("mountPath")) for m in _mounts(container)}
            for name, path in sorted(targets - has):
                found.append(Finding(file, doc["kind"], doc["metadata"]["name"],
                                     f"containers/{container.get('name')}/volumeMounts",
                                     f"reads what init container {init.get('name')} linked into volume {name} at "
                                     f"{path}, but does not mount {name} there, so every link dangles; mount it "
                                     f"read-only at {path}"))
    return found


def _headless_service(file: str, name: str, workloads: dict[tuple[Any, Any], tuple[str, Obj]]) -> list[Finding]:
    """A Service named like a LeaderWorkerSet: its controller then creates no headless Service, and the group's
    DNS names (``<lws>-<group>-<index>.<lws>``) never resolve."""
    if ("LeaderWorkerSet", name) not in workloads:
        return []
    return [Finding(file, "Service", name, "metadata/name", "has the LeaderWorkerSet's name, so the LeaderWorkerSet "
                    "controller creates no headless Service and the workers' DNS names never resolve; give this "
                    "Service another name (trtllm-kit names it <name>-api)")]


def _fails_safe(file: str, name: str, spec: Obj) -> list[Finding]:
    """A ScaledObject that reads a missing series as 0 (KEDA's default) or has no fallback scales down blindly."""
    found = []
    for index, trigger in enumerate(spec.get("triggers") or []):
        if trigger.get("type") == "prometheus" and \
                str((trigger.get("metadata") or {}).get("ignoreNullValues", "true")).lower() != "false":
            found.append(Finding(file, "ScaledObject", name, f"spec/triggers/{index}/metadata/ignoreNullValues",
                                 "an empty query result would read as 0 and scale down to the minimum; set "
                                 'ignoreNullValues: "false" so that it counts as a failure'))
    if "fallback" not in spec:
        found.append(Finding(file, "ScaledObject", name, "spec/fallback", "without a fallback a failing query "
                             "leaves the replicas to chance; add fallback {failureThreshold, replicas, behavior: "
                             "currentReplicasIfHigher}"))
    return found


def _scaling_adapters(workloads: dict[tuple[Any, Any], tuple[str, Obj]]) -> set[tuple[str, str]]:
    """(kind, name) of the scaling adapters the Dynamo operator creates: ``<graph>-<component>`` per component that
    sets ``scalingAdapter``."""
    return {("DynamoGraphDeploymentScalingAdapter", f"{name}-{str(c.get('name')).lower()}")
            for (kind, name), (_, doc) in workloads.items() if kind == "DynamoGraphDeployment"
            for c in (doc.get("spec") or {}).get("components") or [] if "scalingAdapter" in c}


def lint(docs: list[tuple[str, Obj]]) -> list[Finding]:
    """Problems the schemas cannot see: grace periods, Service and PodMonitor selectors, autoscaler targets.

    Arguments:
        docs: (file, object) pairs of a deploy directory.
    """
    found: list[Finding] = []
    workloads = {(d.get("kind"), (d.get("metadata") or {}).get("name")): (f, d) for f, d in docs
                 if d.get("kind") in WORKLOADS}
    serving_labels: list[dict[str, str]] = []
    for (kind, _), (file, doc) in workloads.items():
        templates = _pod_templates(doc)
        for template in templates:
            found += _grace(file, doc, template) + _startup(file, doc, template) + \
                check_compute_capability(file, doc, template) + _dangling_links(file, doc, template)
        serving = templates if kind == "DynamoGraphDeployment" else templates[:1]  # each Dynamo component serves
        serving_labels += [((template.get("metadata") or {}).get("labels")) or {} for template in serving]
        if kind == "LeaderWorkerSet" and (doc.get("spec") or {}).get("startupPolicy", "LeaderCreated") != \
                "LeaderCreated":
            found.append(Finding(file, kind, doc["metadata"]["name"], "spec/startupPolicy", "the leader waits for "
                                 "its workers, so workers must start with it: use LeaderCreated"))
    for file, doc in docs:
        kind, name = str(doc.get("kind")), str((doc.get("metadata") or {}).get("name"))
        spec = doc.get("spec") or {}
        wanted = None
        if kind == "Service":
            wanted = spec.get("selector") or {}
            found += _headless_service(file, name, workloads)
        elif kind in ("PodMonitor", "InferencePool"):
            wanted = (spec.get("selector") or {}).get("matchLabels") or {}
        if wanted is not None and not any(wanted.items() <= labels.items() for labels in serving_labels):
            found.append(Finding(file, kind, name, "selector", f"{wanted} selects no serving pod of this directory "
                                 "(on several nodes only the leaders serve)"))
        if kind == "ScaledObject":
            found += _fails_safe(file, name, spec)
        if kind == "ConfigMap" and PLAN_FILE in (doc.get("data") or {}):
            found += _leader_plan(file, name, doc["data"], workloads)
        if kind == "ConfigMap" and ((doc.get("metadata") or {}).get("labels") or {}).get(SIDECAR_LABEL[0]):
            found += _dashboards(file, name, doc.get("data") or {})
        if kind == "HTTPRoute":
            found += _route_backends(file, name, spec, docs)
        if kind == "HTTPScaledObject":
            found += _held_request(file, name, doc, workloads)
        if kind in ("ScaledObject", "HorizontalPodAutoscaler", "HTTPScaledObject"):
            ref = spec.get("scaleTargetRef") or {}
            if (ref.get("kind", "Deployment"), ref.get("name")) not in workloads and \
                    (ref.get("kind"), ref.get("name")) not in _scaling_adapters(workloads):
                found.append(Finding(file, kind, name, "spec/scaleTargetRef", f"{ref.get('kind', 'Deployment')} "
                                     f"{ref.get('name')} is not in this directory"))
    return found + unreachable_ports(docs)


def _dashboards(file: str, name: str, data: Obj) -> list[Finding]:
    """Entries of a Grafana sidecar ConfigMap that are not ``.json`` dashboards with panels."""
    found = []
    for key, text in data.items():
        try:
            model = json.loads(text) if key.endswith(".json") else None
        except (TypeError, ValueError) as exc:
            model = f"not JSON ({exc})"
        if not isinstance(model, dict) or not isinstance(model.get("panels"), list):
            problem = model if isinstance(model, str) else "not a Grafana dashboard (.json with panels)"
            found.append(Finding(file, "ConfigMap", name, f"data/{key}", f"is {problem}; Grafana's sidecar loads "
                                 "only dashboards: regenerate it with trtllm-kit deploy"))
    return found


def _held_request(file: str, name: str, doc: Obj, workloads: dict[tuple[Any, Any], tuple[str, Obj]]) -> list[Finding]:
    """An interceptor that gives up on a request at zero before the workload's startup budget is out."""
    ref = (doc.get("spec") or {}).get("scaleTargetRef") or {}
    _, workload = workloads.get((ref.get("kind", "Deployment"), ref.get("name")), ("", {}))
    budgets = [((t.get("metadata") or {}).get("annotations") or {}).get(BUDGET_ANNOTATION)
               for t in _pod_templates(workload)[:1]] if workload else []
    budget = int(budgets[0]) if budgets and budgets[0] else None
    wait = condition_wait_s(doc)
    if budget is None or (wait is not None and wait >= budget):
        return []
    held = f"{wait} s" if wait is not None else "as long as the interceptor's global setting says"
    return [Finding(file, "HTTPScaledObject", name, "spec/timeouts/conditionWait", f"holds the first request "
                    f"{held}, not the startup budget of {budget} s: it would fail while a replica starts; set it to "
                    f"{budget}s")]


def _route_backends(file: str, name: str, spec: Obj, docs: list[tuple[str, Obj]]) -> list[Finding]:
    """An HTTPRoute sending traffic to an InferencePool this directory does not hold."""
    pools = {(d.get("metadata") or {}).get("name") for _, d in docs if d.get("kind") == "InferencePool"}
    return [Finding(file, "HTTPRoute", name, "spec/rules/backendRefs", f"InferencePool {ref.get('name')} is not in "
                    "this directory; name the deployment's pool")
            for rule in spec.get("rules") or [] for ref in rule.get("backendRefs") or []
            if ref.get("kind") == "InferencePool" and ref.get("name") not in pools]
