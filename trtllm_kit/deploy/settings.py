"""``DeploySettings``: what the user chooses about a deployment, from flags and the ``[deploy]`` TOML table."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from trtllm_kit import __version__
from trtllm_kit.deploy.image import TAG_CONVENTION
from trtllm_kit.deploy.pod_extras import PodExtras
from trtllm_kit.deploy.versions import KEDA_DEFAULT, KUBERNETES_DEFAULT, Versions
from trtllm_kit.errors import KitUsageError
from trtllm_kit.spec import load_table

AUTOSCALERS = ("keda", "hpa", "none")
ROUTERS = ("kube-proxy", "inference-extension")
LISTS = ("tolerations", "networks", "capabilities")  # repeatable flags, TOML arrays
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$")
LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
RESOURCE_NAME = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


@dataclass(frozen=True)
class DeploySettings:
    """One deployment's choices; defaults are safe for a first apply.

    ``image`` is the serving image built from ``docker/Dockerfile`` (NVIDIA's Triton TensorRT-LLM container with
    the kit installed), pushed to a registry the cluster pulls from; its TensorRT-LLM version is read from its tag
    (``deploy/image.py``) or given as ``image_trtllm_version``. ``gpu_product`` pins the pods to one GPU product
    (GPU Feature Discovery's ``nvidia.com/gpu.product``); engines are pinned to their build GPU anyway.

    ``artifact_url`` (a tar of the build output, fetched by an init container) and ``pvc`` (a claim that holds
    the build output at its root) are the two ways the artifact reaches the pod; exactly one is needed.
    ``min_replicas`` 0 scales to zero through KEDA's HTTP add-on (``deploy/scale_to_zero.py``).
    ``queue_target`` is the waiting requests per replica the autoscaler aims at; ``ttft_slo_s`` the p90 time to first
    token above which an alert fires (``deploy/alerts.py``). ``load_gbps`` is the aggregate
    read rate (GB/s) of the volume the artifact is read from, shared by every rank reading it at once;
    ``worker_wait_s`` is how long a multi-node leader waits for its workers, inside its startup budget.

    ``monitor_labels`` go on the PodMonitor and the PrometheusRule so that the Prometheus operator's selectors
    pick them up (kube-prometheus-stack selects ``release: <its Helm release>``, ``prometheus`` in NVIDIA's
    tutorials). ``fallback_replicas`` is what KEDA keeps (at least, the running ones if more) while its query
    fails; default ``min_replicas``.

    ``api_keys_secret`` names a Secret whose ``keys.json`` (a ``trtllm-kit keys`` file) the OpenAI gateway
    requires keys from (``deploy/gateway.py``).

    ``k8s_version`` and ``keda_version`` are the target cluster's (``deploy/versions.py``): they decide what is
    emitted (the preStop sleep action, native sidecars, KEDA's fallback behaviour) and what ``deploy check``
    refuses. ``tolerations``, ``networks`` (Multus) and ``capabilities`` (``IPC_LOCK``) are added to every serving
    pod (``deploy/pod_extras.py``). ``router`` ``inference-extension`` routes across replicas through an
    ``InferencePool`` attached to the Gateway ``gateway`` (``deploy/router.py``); ``kube-proxy`` leaves it to the
    Service.

    Across nodes: ``topology_key`` is a node label whose domain holds a whole group (LeaderWorkerSet's
    exclusive topology: a required affinity, so every node must carry the label, and one group per domain; empty,
    the default, places groups freely); ``rdma_resources`` are extended
    resources every pod of a group requests (``rdma/ib: 1``, ``vpc.amazonaws.com/efa: 32``); ``nccl_env`` are
    environment variables set in every pod and forwarded by ``mpirun`` to every rank; ``ssh_secret`` names a
    Secret holding ``id_ed25519`` and ``id_ed25519.pub`` for the group's ssh (default: a fresh pair written
    beside the objects and applied by kustomize).
    """

    image: str | None = None
    image_trtllm_version: str | None = None
    gpu_product: str | None = None
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
    worker_wait_s: int = 600
    shm_per_rank: str = "2Gi"
    queue_target: float = 4.0
    ttft_slo_s: float = 2.0
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    run_as_user: int = 1000
    topology_key: str = ""
    rdma_resources: dict[str, int] = field(default_factory=dict)
    nccl_env: dict[str, str] = field(default_factory=dict)
    ssh_secret: str | None = None
    monitor_labels: dict[str, str] = field(default_factory=lambda: {"release": "prometheus"})
    fallback_replicas: int | None = None
    api_keys_secret: str | None = None
    k8s_version: str = KUBERNETES_DEFAULT
    keda_version: str = KEDA_DEFAULT
    tolerations: tuple[str, ...] = ()
    networks: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ()
    router: str = "kube-proxy"
    gateway: str = "inference-gateway"

    def __post_init__(self) -> None:
        if not self.image:
            raise KitUsageError(f"--image is needed: the serving image built from docker/Dockerfile and pushed to "
                                f"your registry, tagged {TAG_CONVENTION} (e.g. "
                                f"registry.example/trtllm-kit:{__version__}-trtllm1.2.1).")
        if self.autoscaler not in AUTOSCALERS:
            raise KitUsageError(f"--autoscaler {self.autoscaler!r} is not known; use one of {', '.join(AUTOSCALERS)}.")
        if self.router not in ROUTERS:
            raise KitUsageError(f"--router {self.router!r} is not known; use one of {', '.join(ROUTERS)}.")
        if (self.artifact_url is None) == (self.pvc is None):
            raise KitUsageError("the artifact reaches the pod either by --artifact-url URL (a .tar of the build "
                                "output) or by --pvc NAME (a claim holding it); give exactly one.")
        for flag, value in (("--name", self.name), ("--namespace", self.namespace), ("--pvc", self.pvc),
                            ("--ssh-secret", self.ssh_secret), ("--api-keys-secret", self.api_keys_secret),
                            ("--gateway", self.gateway)):
            if value is not None and (len(value) > 63 or not DNS_LABEL.match(value)):
                raise KitUsageError(f"{flag} {value!r} is not a Kubernetes name; use lower-case letters, digits "
                                    "and '-' (at most 63).")
        if not 0 <= self.min_replicas <= self.max_replicas or self.max_replicas < 1:
            raise KitUsageError(f"--min-replicas {self.min_replicas} / --max-replicas {self.max_replicas}: need "
                                "0 <= min <= max and max >= 1.")
        if self.min_replicas == 0 and self.autoscaler != "keda":
            raise KitUsageError(f"--min-replicas 0 needs --autoscaler keda (KEDA's HTTP add-on holds the first "
                                f"request while a replica starts), got --autoscaler {self.autoscaler}.")
        for flag, number in (("--gpus-per-node", self.gpus_per_node), ("exit_timeout_s", self.exit_timeout_s),
                             ("worker_wait_s", self.worker_wait_s)):
            if number < 1:
                raise KitUsageError(f"{flag} must be at least 1, got {number}.")
        if self.drain_s < 0 or self.load_gbps <= 0 or self.queue_target <= 0:
            raise KitUsageError(f"drain_s {self.drain_s}, load_gbps {self.load_gbps} and queue_target "
                                f"{self.queue_target} must be positive.")
        if not self.ttft_slo_s > 0:
            raise KitUsageError(f"--ttft-slo {self.ttft_slo_s} must be a positive number of seconds, e.g. 2.")
        if not QUANTITY.match(self.shm_per_rank):
            raise KitUsageError(f"shm_per_rank {self.shm_per_rank!r} is not a Kubernetes quantity like 2Gi.")
        for name, amount in self.rdma_resources.items():
            if not RESOURCE_NAME.match(name) or not isinstance(amount, int) or amount < 1:
                raise KitUsageError(f"--rdma-resource {name}={amount} is not an extended resource and a count; "
                                    "write NAME=N, e.g. rdma/ib=1 or vpc.amazonaws.com/efa=32.")
        if self.fallback_replicas is not None and not \
                self.min_replicas <= self.fallback_replicas <= self.max_replicas:
            raise KitUsageError(f"--fallback-replicas {self.fallback_replicas} must lie between --min-replicas "
                                f"{self.min_replicas} and --max-replicas {self.max_replicas}.")
        for key, value in self.monitor_labels.items():
            if not LABEL_KEY.match(key) or not isinstance(value, str) or not LABEL_VALUE.match(value):
                raise KitUsageError(f"--monitor-labels {key}={value!r} is not a Kubernetes label; write k=v, e.g. "
                                    "release=prometheus.")
        for name, value in self.nccl_env.items():
            if not ENV_NAME.match(name) or not isinstance(value, str):
                raise KitUsageError(f"--nccl-env {name}={value!r} is not an environment variable; write K=V with K "
                                    "in capitals, e.g. NCCL_IB_HCA=mlx5.")
        if not 0 < self.openai_port < 65536 or self.openai_port in (8000, 8001, 8002):
            raise KitUsageError(f"--openai-port {self.openai_port} must be a free TCP port other than 8000-8002.")
        _ = self.versions, self.extras  # a bad version, toleration, network or capability is refused here

    @property
    def versions(self) -> Versions:
        """The cluster's Kubernetes and KEDA versions."""
        return Versions.parse(self.k8s_version, self.keda_version)

    @property
    def extras(self) -> PodExtras:
        """Tolerations, networks and capabilities for every serving pod."""
        return PodExtras(tuple(self.tolerations), tuple(self.networks), tuple(self.capabilities))

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
    given = {k: v for k, v in flags.items() if v is not None and v != ()}
    for key, flag, kind in (("rdma_resources", "--rdma-resource", int), ("nccl_env", "--nccl-env", str),
                            ("monitor_labels", "--monitor-labels", str)):
        if isinstance(given.get(key), tuple):
            given[key] = _pairs(flag, given[key], kind)
    values = {**table, **given}
    for key in LISTS:
        if isinstance(values.get(key), list):
            values[key] = tuple(values[key])
        if key in values and not all(isinstance(v, str) for v in values[key]):
            raise KitUsageError(f"[deploy] {key} must be a list of strings, got {values[key]!r}.")
    try:
        return DeploySettings(**values)
    except TypeError as exc:
        raise KitUsageError(f"[deploy] settings are malformed ({exc}); check the value types.") from None


def _pairs(flag: str, texts: tuple[str, ...], kind: type) -> dict[str, Any]:
    """``K=V`` flags as a mapping (``V`` read as ``kind``).

    Arguments:
        flag: the flag (for messages); texts: its values; kind: ``int`` or ``str``.
    """
    found: dict[str, Any] = {}
    for text in texts:
        key, sep, value = text.partition("=")
        try:
            found[key.strip()] = kind(value.strip())
        except ValueError:
            sep = ""
        if not sep or not key.strip():
            raise KitUsageError(f"{flag} {text!r} is not K=V; write e.g. {flag} "
                                f"{'rdma/ib=1' if kind is int else 'NCCL_IB_HCA=mlx5'}.")
    return found
