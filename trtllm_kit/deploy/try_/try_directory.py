"""``deploy try DIR``: the pods of a deploy directory started here, in namespaces of their own, probed as the
kubelet probes them, one OpenAI request sent through the clients' Service, then stopped as the kubelet stops them.

Each pod has its own network namespace on a bridge in a cluster namespace (nothing is added to this machine's
own); each container its own mount namespace, whose root is this machine's, copy-on-write, with the image's paths
(``try_/image.py``) and the container's volumes at their ``mountPath``s and nowhere else.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trtllm_kit.deploy.render import RECORD
from trtllm_kit.deploy.try_.cluster import Cluster, PodPlan, read_cluster
from trtllm_kit.deploy.try_.containers import PodContext
from trtllm_kit.deploy.try_.diagnose import dangling_links
from trtllm_kit.deploy.try_.image import local_image
from trtllm_kit.deploy.try_.interceptor import Interceptor, ScaleToZero
from trtllm_kit.deploy.try_.netns import ClusterNetwork, NetNamespace, entered
from trtllm_kit.deploy.try_.pod_run import PodRun, ProbeRecord, StopRecord
from trtllm_kit.deploy.try_.services import Relay
from trtllm_kit.deploy.try_.volumes import pod_volumes
from trtllm_kit.deploy.validate import load_dir
from trtllm_kit.errors import KitUsageError

Obj = dict[str, Any]
SLACK_S = 60  # past the startup budget, for this machine's own load
LOG_CHARS = 16000  # enough for two tritonserver start-ups (their option tables are wide)


@dataclass
class PodReport:
    """One pod: its address, when it became ready, its probes, how its containers stopped and the end of each
    container's output (``LOG_CHARS``), as ``kubectl logs`` would show it."""

    name: str
    address: str
    ready_after_s: float | None = None
    probes: list[ProbeRecord] = field(default_factory=list)
    stopped: list[StopRecord] = field(default_factory=list)
    logs: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ColdStart:
    """A request that found the deployment at zero: how long the interceptor held it, beside the start-up the
    directory's record predicts (reading, fixed terms, a leader's wait) and its budget."""

    held_s: float
    predicted_s: int
    budget_s: int


@dataclass
class TryReport:
    """What ``deploy try`` saw: the image it stood in for, the pods, the Service reached, the answer or the cause;
    at zero replicas, the first request's wait."""

    image: str
    service: str
    pods: list[PodReport] = field(default_factory=list)
    answer: str | None = None
    failure: str | None = None
    cold_start: ColdStart | None = None

    def to_dict(self) -> Obj:
        return asdict(self)


def _hosts(cluster: Cluster, own: PodPlan, addresses: dict[str, str], services: dict[str, str]) -> str:
    """``/etc/hosts`` standing for the cluster's DNS as ``own`` sees it."""
    lines = ["127.0.0.1 localhost"]
    for pod in cluster.pods:
        names = cluster.hostnames(pod)
        names = names if pod is own else names[1:]
        if names:
            lines.append(f"{addresses[pod.name]} {' '.join(names)}")
    lines += [f"{services[s.name]} {' '.join(cluster.service_names(s))}" for s in cluster.services
              if s.name in services]
    return "\n".join(lines) + "\n"


def _target_port(cluster: Cluster, selector: dict[str, str], target: int | str) -> int:
    if isinstance(target, int) or str(target).isdigit():
        return int(target)
    for pod in cluster.pods:
        if selector.items() <= pod.labels.items():
            for container in pod.spec.get("containers") or []:
                for port in container.get("ports") or []:
                    if port.get("name") == target:
                        return int(port["containerPort"])
    raise KitUsageError(f"no pod the Service selects has a port named {target!r}.")


def _request(node: Path, address: str, port: int, method: str, path: str, body: Obj | None = None,
             timeout_s: float = 300) -> Obj:
    with entered(node):
        connection = http.client.HTTPConnection(address, port, timeout=timeout_s)
        try:
            connection.request(method, path, body=json.dumps(body) if body else None,
                               headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            text = response.read().decode(errors="replace")
        finally:
            connection.close()
    if response.status != 200:
        raise KitUsageError(f"{method} {path} through the Service answered {response.status}: {text[:300]}")
    return dict(json.loads(text))


def try_directory(directory: Path, pvc_dirs: dict[str, Path], *, prompt: str = "The capital of France is",
                  max_tokens: int = 8, timeout_s: float | None = None) -> TryReport:
    """Run the pods of ``directory`` here, send one completion through the clients' Service, stop them.

    Arguments:
        directory: a ``deploy k8s`` output; pvc_dirs: claim name → the directory standing for it; prompt,
        max_tokens: the request; timeout_s: how long the pods may take to become ready (default: the startup
        budget the directory records, and a minute).
    """
    cluster = read_cluster(directory)
    record = json.loads((directory / RECORD).read_text())
    port = int(record["settings"]["openai_port"])
    budget = timeout_s if timeout_s is not None else float(record.get("startup_budget_s", 600)) + SLACK_S
    if cluster.notes:  # the cluster would never give the group its names: nothing to run
        return TryReport("", record["service"], failure=f"{cluster.notes[0]}, so the group cannot start.")
    work = Path(tempfile.mkdtemp(prefix="trtllm-kit-try-"))
    work.chmod(0o755)  # the containers' users pass through it to their volumes and the image's links
    image = local_image(work / "cache")
    report = TryReport(image.describe(), record["service"])
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, True)
        network = ClusterNetwork()
        stack.callback(network.close)
        namespaces = {pod.name: NetNamespace() for pod in cluster.pods}
        for namespace in namespaces.values():
            stack.callback(namespace.close)
        addresses = {name: network.add_pod(ns, i) for i, (name, ns) in enumerate(namespaces.items())}
        services = {s.name: network.add_service_address() for s in cluster.services if not s.headless}
        runs = []
        for pod in cluster.pods:
            pod_dir = work / "pods" / pod.name
            context = PodContext(pod.name, cluster.namespace, addresses[pod.name], namespaces[pod.name].path,
                                 pod_volumes(pod.spec, cluster, pod_dir, pvc_dirs),
                                 _hosts(cluster, pod, addresses, services), pod.injected_env,
                                 dict(pod.spec.get("securityContext") or {}), pod_dir)
            runs.append(PodRun(context, pod.spec, image, network.node.path))
            report.pods.append(PodReport(pod.name, addresses[pod.name]))
        starters: list[threading.Thread] = []

        def start_pods() -> None:
            starters[:] = [threading.Thread(target=run.start, args=(time.monotonic() + budget,), daemon=True)
                           for run in runs]
            for thread in starters:
                thread.start()

        zero = ScaleToZero.find(load_dir(directory))
        interceptor: Interceptor | None = None
        for service in cluster.services:
            if service.headless:
                continue
            matched = [run for run, pod in zip(runs, cluster.pods, strict=True)
                       if service.selector.items() <= pod.labels.items()]
            for _, number, target in service.ports:
                args = (network.node.path, services[service.name], number,
                        _target_port(cluster, service.selector, target), _ready_addresses(matched))
                if zero is not None and (service.name, number) == (zero.service, zero.port):
                    interceptor = Interceptor(*args, wake=start_pods, hold_s=zero.hold_s,
                                              failed=lambda: any(run.problem is not None for run in runs))
                    stack.callback(interceptor.close)
                else:
                    stack.callback(Relay(*args).close)
        started = time.monotonic()
        deadline = started + budget
        if interceptor is None:
            start_pods()
        try:
            address = services[record["service"]]
            if interceptor is not None:  # nothing runs until the first request arrives
                report.cold_start = _first_request(network.node.path, address, port, interceptor, record)
                started = interceptor.woke_at or started
                deadline = started + budget
            report.failure = _wait(runs, report, started, deadline)
            if report.failure is None and interceptor is not None and report.cold_start is None:
                report.failure = "the interceptor let the first request go unanswered though the pods became ready."
            if report.failure is None:
                models = _request(network.node.path, address, port, "GET", "/v1/models")
                model = models["data"][0]["id"]
                reply = _request(network.node.path, address, port, "POST", "/v1/completions",
                                 {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
                report.answer = str(reply["choices"][0]["text"])
        except KitUsageError as exc:
            report.failure = str(exc)
        finally:
            for thread in starters:
                thread.join(timeout=max(0.0, deadline - time.monotonic()))
            for run, pod_report in zip(runs, report.pods, strict=True):
                pod_report.probes = list(run.probes)
                pod_report.stopped = run.stop(float(run.spec.get("terminationGracePeriodSeconds", 30)))
                pod_report.logs = {c.name: c.tail(LOG_CHARS) for c in run.containers}
    return report


def _first_request(node: Path, address: str, port: int, interceptor: Interceptor, record: Obj) -> ColdStart | None:
    """Send the first request to a deployment at zero; how long the interceptor held it (None when the connection
    was let go unanswered: no replica became ready)."""
    try:
        _request(node, address, port, "GET", "/v1/models", timeout_s=interceptor.hold_s + SLACK_S)
    except (OSError, http.client.HTTPException):
        return None
    startup = record.get("startup") or {}
    predicted = sum(int(startup.get(key, 0)) for key in ("read_s", "fixed_s", "wait_s"))
    return ColdStart(interceptor.held_s[0] if interceptor.held_s else 0.0, predicted,
                     int(record.get("startup_budget_s", 0)))


def _ready_addresses(runs: list[PodRun]) -> Callable[[], list[str]]:
    """The Service's endpoints: the addresses of the ready pods among ``runs``, when asked."""
    return lambda: [run.context.address for run in runs if run.is_ready]


def _ready_at_failure(runs: list[PodRun], report: TryReport, started: float) -> None:
    """When a pod fails, the others' readiness as it is now, not as their probes' last period found it."""
    for run, pod_report in zip(runs, report.pods, strict=True):
        if pod_report.ready_after_s is None and run.ready_now():
            pod_report.ready_after_s = round(time.monotonic() - started, 1)


def _wait(runs: list[PodRun], report: TryReport, started: float, deadline: float) -> str | None:
    """None once every pod is ready; else the first cause, in one sentence."""
    while time.monotonic() < deadline:
        for run, pod_report in zip(runs, report.pods, strict=True):
            if run.problem is not None:
                _ready_at_failure(runs, report, started)
                cause = next(filter(None, (dangling_links(c) for c in [*run.containers, *run.sidecars])), None)
                return f"pod {run.name}: {cause or run.problem}."
            if run.is_ready and pod_report.ready_after_s is None:
                pod_report.ready_after_s = round(time.monotonic() - started, 1)
        if all(run.is_ready for run in runs):
            return None
        time.sleep(0.5)
    waiting = [run.name for run in runs if not run.is_ready]
    return f"pods {', '.join(waiting)} were not ready within {deadline - started:.0f} s."
