"""``DeploySettings``: what the user chooses about a deployment, from flags and the ``[deploy]`` TOML table."""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from trtllm_kit import __version__
from trtllm_kit.errors import KitUsageError
from trtllm_kit.spec import load_table

AUTOSCALERS = ("keda", "hpa", "none")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$")


@dataclass(frozen=True)
class DeploySettings:
    """One deployment's choices; defaults are safe for a first apply.

    ``image`` must hold the kit (``pip install trtllm-kit``) on top of NVIDIA's Triton TensorRT-LLM image; the
    default names the image the README's two-line Dockerfile builds.

    ``artifact_url`` (a tar of the build output, fetched by an init container) and ``pvc`` (a claim that holds
    the build output at its root) are the two ways the artifact reaches the pod; exactly one is needed.
    ``queue_target`` is the waiting requests per replica the autoscaler aims at.
    """

    image: str = f"trtllm-kit:{__version__}"
    name: str | None = None
    namespace: str = "default"
    gpus_per_node: int = 8
    min_replicas: int = 1
    max_replicas: int = 4
    autoscaler: str = "keda"
    artifact_url: str | None = None
    pvc: str | None = None
    openai_port: int = 9000
    exit_timeout_s: int = 30
    drain_s: int = 10
    load_gbps: float = 0.5
    shm_per_rank: str = "2Gi"
    queue_target: float = 4.0
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    run_as_user: int = 1000

    def __post_init__(self) -> None:
        if self.autoscaler not in AUTOSCALERS:
            raise KitUsageError(f"--autoscaler {self.autoscaler!r} is not known; use one of {', '.join(AUTOSCALERS)}.")
        if (self.artifact_url is None) == (self.pvc is None):
            raise KitUsageError("the artifact reaches the pod either by --artifact-url URL (a .tar of the build "
                                "output) or by --pvc NAME (a claim holding it); give exactly one.")
        for flag, value in (("--name", self.name), ("--namespace", self.namespace), ("--pvc", self.pvc)):
            if value is not None and (len(value) > 63 or not DNS_LABEL.match(value)):
                raise KitUsageError(f"{flag} {value!r} is not a Kubernetes name; use lower-case letters, digits "
                                    "and '-' (at most 63).")
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise KitUsageError(f"--min-replicas {self.min_replicas} / --max-replicas {self.max_replicas}: need "
                                "1 <= min <= max.")
        for flag, number in (("--gpus-per-node", self.gpus_per_node), ("exit_timeout_s", self.exit_timeout_s)):
            if number < 1:
                raise KitUsageError(f"{flag} must be at least 1, got {number}.")
        if self.drain_s < 0 or self.load_gbps <= 0 or self.queue_target <= 0:
            raise KitUsageError(f"drain_s {self.drain_s}, load_gbps {self.load_gbps} and queue_target "
                                f"{self.queue_target} must be positive.")
        if not QUANTITY.match(self.shm_per_rank):
            raise KitUsageError(f"shm_per_rank {self.shm_per_rank!r} is not a Kubernetes quantity like 2Gi.")
        if not 0 < self.openai_port < 65536 or self.openai_port in (8000, 8001, 8002):
            raise KitUsageError(f"--openai-port {self.openai_port} must be a free TCP port other than 8000-8002.")

    @property
    def grace_period_s(self) -> int:
        """``terminationGracePeriodSeconds``: the preStop drain, Triton's exit timeout, and 10 s to spare."""
        return self.drain_s + self.exit_timeout_s + 10

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def deploy_table(config: Path) -> dict[str, Any]:
    """The ``[deploy]`` table of a ``trtllm-kit.toml`` (keys spelled as the flags, ``-`` or ``_``).

    Arguments:
        config: the TOML file.
    """
    table = load_table(config, "deploy")
    return {key.replace("-", "_"): value for key, value in table.items()}


def deploy_settings(table: dict[str, Any], flags: dict[str, Any]) -> DeploySettings:
    """Settings from the TOML table, overridden by the flags the user typed.

    Arguments:
        table: the ``[deploy]`` table (possibly empty).
        flags: the flags given on the command line (``None`` values are ignored).
    """
    known = {f.name for f in fields(DeploySettings)}
    unknown = sorted(set(table) - known)
    if unknown:
        raise KitUsageError(f"[deploy] has unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}.")
    values = {**table, **{k: v for k, v in flags.items() if v is not None}}
    try:
        return DeploySettings(**values)
    except TypeError as exc:
        raise KitUsageError(f"[deploy] settings are malformed ({exc}); check the value types.") from None
