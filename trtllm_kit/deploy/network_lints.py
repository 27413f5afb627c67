"""What the NetworkPolicies of a deploy directory let through, checked against what its Services route: a port a
Service sends clients to must be open to every source on the pods it selects."""

from __future__ import annotations

from typing import Any

from trtllm_kit.deploy.validate import Finding

Obj = dict[str, Any]


def _selects(policy: Obj, labels: dict[str, str]) -> bool:
    wanted = ((policy.get("spec") or {}).get("podSelector") or {}).get("matchLabels") or {}
    return wanted.items() <= labels.items()


def _open_ports(policy: Obj) -> set[Any] | None:
    """Ports open to every source (None: every port), from the rules without ``from``."""
    spec = policy.get("spec") or {}
    if "Ingress" not in (spec.get("policyTypes") or ["Ingress"]):
        return None
    found: set[Any] = set()
    for rule in spec.get("ingress") or []:
        if rule.get("from"):
            continue
        if not rule.get("ports"):
            return None
        found |= {port.get("port") for port in rule["ports"]}
    return found


def unreachable_ports(docs: list[tuple[str, Obj]]) -> list[Finding]:
    """Every Service port whose target the NetworkPolicies selecting the Service's pods keep closed to clients.

    Arguments:
        docs: (file, object) pairs of a deploy directory.
    """
    policies = [doc for _, doc in docs if doc.get("kind") == "NetworkPolicy"]
    found = []
    for file, doc in docs:
        if doc.get("kind") != "Service" or not policies:
            continue
        spec = doc.get("spec") or {}
        selecting = [p for p in policies if _selects(p, spec.get("selector") or {})]
        if not selecting:
            continue
        opened = [_open_ports(p) for p in selecting]
        for port in spec.get("ports") or []:
            target = port.get("targetPort", port.get("port"))
            if not any(ports is None or target in ports or port.get("port") in ports for ports in opened):
                found.append(Finding(file, "Service", str(doc["metadata"].get("name")), "spec/ports",
                                     f"routes port {target!r}, which NetworkPolicy "
                                     f"{selecting[0]['metadata'].get('name')} closes to clients; add it to the "
                                     "policy's ingress rule without 'from'"))
    return found
