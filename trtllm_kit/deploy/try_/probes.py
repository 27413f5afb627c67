"""Probes as the kubelet runs them: ``httpGet`` (a status of 200-399 within ``timeoutSeconds``) or ``tcpSocket``
(a connection) against the pod's address, every ``periodSeconds`` after ``initialDelaySeconds``; a probe fails
after ``failureThreshold`` failures in a row. Named ports are the container's ports of that name."""

from __future__ import annotations

import http.client
import socket
from dataclasses import dataclass
from typing import Any

from trtllm_kit.errors import KitUsageError

Obj = dict[str, Any]
KINDS = ("startupProbe", "readinessProbe", "livenessProbe")


@dataclass(frozen=True)
class Probe:
    """One probe of one container."""

    kind: str  # startupProbe | readinessProbe | livenessProbe
    port: int
    path: str | None  # None: tcpSocket
    period_s: float
    failure_threshold: int
    timeout_s: float
    initial_delay_s: float

    @property
    def allowed_s(self) -> float:
        """How long the probe may fail before it acts: the delay and ``failureThreshold`` periods."""
        return self.initial_delay_s + self.period_s * self.failure_threshold

    def describe(self) -> str:
        what = f"GET :{self.port}{self.path}" if self.path is not None else f"TCP :{self.port}"
        return f"{self.kind} {what} every {self.period_s:g} s, {self.failure_threshold} failures"

    def check(self, address: str) -> tuple[bool, str]:
        """(passed, what was seen) of one try against ``address``; call it inside the cluster's namespace."""
        try:
            if self.path is None:
                with socket.create_connection((address, self.port), timeout=self.timeout_s):
                    return True, "connected"
            connection = http.client.HTTPConnection(address, self.port, timeout=self.timeout_s)
            try:
                connection.request("GET", self.path)
                status = connection.getresponse().status
            finally:
                connection.close()
            return 200 <= status < 400, f"HTTP {status}"
        except OSError as exc:
            return False, type(exc).__name__ if not str(exc) else str(exc)


def _port(container: Obj, port: int | str) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for entry in container.get("ports") or []:
        if entry.get("name") == port:
            return int(entry["containerPort"])
    raise KitUsageError(f"container {container.get('name')} has no port named {port!r}, which a probe names.")


def probes_of(container: Obj) -> dict[str, Probe]:
    """The container's probes by kind.

    Arguments:
        container: the container spec.
    """
    found = {}
    for kind in KINDS:
        spec = container.get(kind)
        if spec is None:
            continue
        if "httpGet" in spec:
            port, path = _port(container, spec["httpGet"]["port"]), str(spec["httpGet"].get("path", "/"))
        elif "tcpSocket" in spec:
            port, path = _port(container, spec["tcpSocket"]["port"]), None
        else:
            raise KitUsageError(f"container {container.get('name')}'s {kind} is neither httpGet nor tcpSocket; "
                                "deploy try runs those two.")
        found[kind] = Probe(kind, port, path, float(spec.get("periodSeconds", 10)),
                            int(spec.get("failureThreshold", 3)), float(spec.get("timeoutSeconds", 1)),
                            float(spec.get("initialDelaySeconds", 0)))
    return found
