"""What a cluster may need on every serving pod beyond the kit's defaults: tolerations of its own taints, secondary
networks (Multus), and ``IPC_LOCK`` for RDMA memory registration.

- ``--toleration KEY[=VALUE][:EFFECT]``: ``Equal`` with a value, ``Exists`` without; no effect tolerates all.
- ``--network NAME`` (``[namespace/]name[@interface]``): a Multus NetworkAttachmentDefinition, listed in the pod
  annotation ``k8s.v1.cni.cncf.io/networks``.
- ``--add-capability IPC_LOCK``: Linux hands an added capability only to a process running as uid 0 (a non-root
  process keeps it in its bounding set alone: kubernetes/kubernetes#56374), so the containers that get it run as
  uid 0 with every other capability dropped and no privilege escalation, and Open MPI is told that root is meant.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from trtllm_kit.errors import KitUsageError

Obj = dict[str, Any]
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
CAPABILITIES = ("IPC_LOCK",)  # RDMA memory registration past RLIMIT_MEMLOCK
NETWORKS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"
NETWORK = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?/)?[a-z0-9]([-a-z0-9.]*[a-z0-9])?(@[A-Za-z0-9_.-]{1,15})?$")
TAINT_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
TAINT_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
ROOT_ENV = (("OMPI_ALLOW_RUN_AS_ROOT", "1"), ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"))


def toleration(text: str) -> Obj:
    """A toleration from ``KEY[=VALUE][:EFFECT]``.

    Arguments:
        text: the flag's value.
    """
    rest, _, effect = text.rpartition(":") if ":" in text else (text, "", "")
    key, sep, value = rest.partition("=")
    if not TAINT_KEY.match(key) or (sep and not TAINT_VALUE.match(value)) or (effect and effect not in EFFECTS):
        raise KitUsageError(f"--toleration {text!r} is not KEY[=VALUE][:EFFECT] with EFFECT one of "
                            f"{', '.join(EFFECTS)}; write e.g. --toleration dedicated=llm:NoSchedule.")
    found: Obj = {"key": key, "operator": "Equal", "value": value} if sep else {"key": key, "operator": "Exists"}
    return {**found, "effect": effect} if effect else found


def check_network(text: str) -> str:
    """A Multus network reference ``[namespace/]name[@interface]``, refused in one sentence when malformed."""
    if not NETWORK.match(text):
        raise KitUsageError(f"--network {text!r} is not a NetworkAttachmentDefinition reference; write "
                            "[namespace/]name[@interface], e.g. --network rdma/ib-net@net1.")
    return text


def check_capability(text: str) -> str:
    if text not in CAPABILITIES:
        raise KitUsageError(f"--add-capability {text!r} is not one the kit adds; it adds {', '.join(CAPABILITIES)} "
                            "(RDMA memory registration) and drops every other capability.")
    return text


@dataclass(frozen=True)
class PodExtras:
    """The additions of one deployment, applied to every serving pod template."""

    tolerations: tuple[str, ...] = ()
    networks: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for text in self.tolerations:
            toleration(text)
        for text in self.networks:
            check_network(text)
        for text in self.capabilities:
            check_capability(text)

    def annotations(self) -> dict[str, str]:
        """The pod template annotations: the Multus networks, if any."""
        return {NETWORKS_ANNOTATION: ",".join(self.networks)} if self.networks else {}

    def apply(self, spec: Obj, containers: list[Obj]) -> None:
        """Add the tolerations to a pod spec, and the capabilities (as uid 0) to its serving ``containers``; the
        pod's other containers stay non-root.

        Arguments:
            spec: the pod spec; containers: the containers that run the server or its ranks.
        """
        if self.tolerations:
            known = spec.setdefault("tolerations", [])
            known += [t for t in map(toleration, self.tolerations) if t not in known]
        if not self.capabilities:
            return
        for container in containers:
            security = container.setdefault("securityContext", {})
            security["capabilities"] = {"drop": ["ALL"], "add": list(self.capabilities)}
            security.update(runAsUser=0, runAsGroup=0, runAsNonRoot=False)
            env = container.setdefault("env", [])
            env += [{"name": name, "value": value} for name, value in ROOT_ENV]
