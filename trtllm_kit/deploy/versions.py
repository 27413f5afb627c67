"""The cluster versions a deployment is written for, and the features each version floor admits.

``deploy k8s --k8s-version/--keda-version`` decide what is emitted (``Versions.has``); ``deploy check`` refuses an
object that uses a feature the stated versions cannot run (``version_findings``). A field the older API already
knows but keeps behind a feature gate that is off by default passes the strict schema of that version, so
schemas alone cannot see these:

- native sidecars (an init container with ``restartPolicy: Always``): Kubernetes 1.29; under 1.28's gate (alpha,
  off) the field is dropped, the sidecar becomes an init container that never ends, and the server never starts;
- the preStop ``sleep`` action: Kubernetes 1.30; under 1.29's gate (alpha, off) the handler is dropped and the pod
  refused;
- ``fallback.behavior`` of a ScaledObject: KEDA 2.17 (kedacore/keda#6464); older CRDs refuse the field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from trtllm_kit.deploy.validate import Finding
from trtllm_kit.errors import KitUsageError

Obj = dict[str, Any]
KUBERNETES_DEFAULT = "1.33"
KEDA_DEFAULT = "2.17"
KUBERNETES_RANGE = ((1, 25), (1, 37))  # the versions kubernetes-validate carries schemas for
VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.\d+)?$")

SIDECARS = "native sidecars (init containers with restartPolicy: Always)"
SLEEP_ACTION = "the preStop sleep action"
FALLBACK_BEHAVIOR = "fallback.behavior"
FLOORS: dict[str, tuple[str, tuple[int, int]]] = {
    SIDECARS: ("Kubernetes", (1, 29)),
    SLEEP_ACTION: ("Kubernetes", (1, 30)),
    FALLBACK_BEHAVIOR: ("KEDA", (2, 17)),
}


def parse_version(flag: str, text: str) -> tuple[int, int]:
    """(major, minor) of ``1.30``, ``v1.30`` or ``1.30.2``.

    Arguments:
        flag: the flag the text came from (for the message); text: the version.
    """
    found = VERSION.match(str(text).strip())
    if found is None:
        raise KitUsageError(f"{flag} {text!r} is not a version; write MAJOR.MINOR, e.g. 1.30.")
    return int(found.group(1)), int(found.group(2))


@dataclass(frozen=True)
class Versions:
    """The Kubernetes and KEDA versions of the target cluster, as ``(major, minor)``."""

    kubernetes: tuple[int, int]
    keda: tuple[int, int]

    @classmethod
    def parse(cls, kubernetes: str, keda: str) -> Versions:
        """Both versions from text, Kubernetes within the range the schemas cover.

        Arguments:
            kubernetes: e.g. ``1.33``; keda: e.g. ``2.17``.
        """
        found = cls(parse_version("--k8s-version", kubernetes), parse_version("--keda-version", keda))
        low, high = KUBERNETES_RANGE
        if not low <= found.kubernetes <= high:
            raise KitUsageError(f"--k8s-version {kubernetes} is outside {low[0]}.{low[1]}-{high[0]}.{high[1]}, the "
                                "versions whose schemas the kit validates against; pick one inside it.")
        return found

    @property
    def kubernetes_text(self) -> str:
        return f"{self.kubernetes[0]}.{self.kubernetes[1]}"

    def has(self, feature: str) -> bool:
        """Whether the stated versions run ``feature`` (one of ``FLOORS``)."""
        system, floor = FLOORS[feature]
        return (self.kubernetes if system == "Kubernetes" else self.keda) >= floor

    def stated(self, feature: str) -> str:
        system, _ = FLOORS[feature]
        version = self.kubernetes if system == "Kubernetes" else self.keda
        return f"{system} {version[0]}.{version[1]}"


def _floor_text(feature: str) -> str:
    system, (major, minor) = FLOORS[feature]
    return f"{system} >= {major}.{minor}"


def _pod_specs(doc: Obj) -> list[Obj]:
    spec = doc.get("spec") or {}
    kind = doc.get("kind")
    if kind == "Deployment":
        return [(spec.get("template") or {}).get("spec") or {}]
    if kind == "LeaderWorkerSet":
        group = spec.get("leaderWorkerTemplate") or {}
        return [(group.get(key) or {}).get("spec") or {} for key in ("leaderTemplate", "workerTemplate")]
    if kind == "DynamoGraphDeployment":
        return [(c.get("podTemplate") or {}).get("spec") or {} for c in spec.get("components") or []]
    return []


def _uses(doc: Obj) -> list[tuple[str, str]]:
    """(feature, path) of every floored feature an object uses."""
    found = []
    if doc.get("kind") == "ScaledObject" and "behavior" in ((doc.get("spec") or {}).get("fallback") or {}):
        found.append((FALLBACK_BEHAVIOR, "spec/fallback/behavior"))
    for spec in _pod_specs(doc):
        for container in spec.get("initContainers") or []:
            if container.get("restartPolicy") == "Always":
                found.append((SIDECARS, f"initContainers/{container.get('name')}/restartPolicy"))
        for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
            if "sleep" in ((container.get("lifecycle") or {}).get("preStop") or {}):
                found.append((SLEEP_ACTION, f"containers/{container.get('name')}/lifecycle/preStop/sleep"))
    return found


def version_findings(docs: list[tuple[str, Obj]], versions: Versions) -> list[Finding]:
    """Objects that use a feature the stated Kubernetes or KEDA version cannot run.

    Arguments:
        docs: (file, object) pairs; versions: the cluster's versions.
    """
    found = []
    for file, doc in docs:
        for feature, path in _uses(doc):
            if not versions.has(feature):
                found.append(Finding(file, str(doc.get("kind")), str((doc.get("metadata") or {}).get("name")), path,
                                     f"uses {feature}, which needs {_floor_text(feature)}, but the cluster is "
                                     f"{versions.stated(feature)}; regenerate with trtllm-kit deploy k8s "
                                     "--k8s-version/--keda-version stating the cluster's versions"))
    return found
