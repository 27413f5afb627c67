"""The ``tritonserver`` command line: one process, or one rank per GPU under ``mpirun``; ports checked first."""

from __future__ import annotations

import os
import random
import socket
from dataclasses import dataclass, field
from pathlib import Path

from trtllm_kit.errors import KitError, KitUsageError
from trtllm_kit.serve.options import Endpoints
from trtllm_kit.serve.server.listeners import port_holder
from trtllm_kit.serve.server.locate import TritonInstall

PYTHON_SHM_DEFAULT_BYTES = 4 * 1024 * 1024
PYTHON_SHM_GROWTH_BYTES = 1024 * 1024
# The Python backend answers its stubs' calls on a pool of threads (32 by default), and a decoupled BLS call holds
# one until the inner model's first response: with 4 x max_batch_size requests queued in the engine the pool ran
# dry and a new request could not reach the engine to be refused (nor a cancellation to be seen).
PYTHON_THREAD_POOL_SIZE = 256
# Triton's API groups (tritonserver --help, "Allowed APIs"). With a token, those that change the server (load code
# through the repository API, map shared memory, write trace and log files) always demand the header
# RESTRICTED_HEADER: TOKEN on HTTP and gRPC; with inference restricted too, every group but health does.
ADMIN_APIS = ("model-repository", "shared-memory", "trace", "logging")
SERVING_APIS = ("metadata", "inference", "model-config", "statistics")
RESTRICTED_HEADER = "trtllm-kit-token"
GRPC_RESTRICTED_HEADER = f"triton-grpc-protocol-{RESTRICTED_HEADER}"  # the metadata key Triton's gRPC checks
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")  # the ports outgoing connections are given
# free_port's own source of randomness: a library that seeds the process's ``random`` (transformers' ``set_seed``, a
# test) would otherwise make processes seeded alike pick the same ports in the same order
_PORT_CHOICE = random.SystemRandom()
LOWEST_FREE_PORT = 20000  # free_port's choice starts here, above the well-known and registered services' usual ports
PORT_TRIES = 64


@dataclass(frozen=True)
class LaunchConfig:
    """Everything the ``tritonserver`` command line is made of.

    ``world_size`` > 1 starts one ``tritonserver`` per rank under ``mpirun`` (TRT-LLM leader mode): rank 0
    loads the whole repository and serves; the other ranks load only ``trtllm_models`` and open no endpoint.
    """

    repo: Path
    endpoints: Endpoints = field(default_factory=Endpoints)
    world_size: int = 1
    shm_prefix: str = "trtllmkit_"
    log_verbose: int = 0
    exit_timeout_s: int = 5
    trtllm_models: tuple[str, ...] = ("tensorrt_llm",)
    extra_args: tuple[str, ...] = ()
    restricted_token: str | None = field(default=None, repr=False)  # demanded by the restricted APIs
    restrict_inference: bool = False  # the token guards inference and metadata too (every API but health)

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise KitUsageError(f"world size must be at least 1, got {self.world_size}.")
        for name, port in self.endpoints.ports().items():
            if not 0 < port < 65536:
                raise KitUsageError(f"--{name.lower()}-port {port} is not a TCP port; choose one in 1-65535.")
        if len(set(self.endpoints.ports().values())) < 3:
            raise KitUsageError(f"the HTTP, gRPC and metrics ports must differ, got {self.endpoints.ports()}.")

    def restricted_apis(self) -> tuple[str, ...]:
        """The API groups that demand the token (none without one)."""
        if not self.restricted_token:
            return ()
        return ADMIN_APIS + SERVING_APIS if self.restrict_inference else ADMIN_APIS

    def rank_shm_prefix(self, rank: int) -> str:
        """The Python backend's shared-memory region prefix of ``rank`` (distinct per rank and per launch)."""
        return f"{self.shm_prefix}{rank}_"


def rank_argv(install: TritonInstall, config: LaunchConfig, rank: int) -> list[str]:
    """One rank's ``tritonserver`` command line.

    Arguments:
        install: the located server.
        config: the launch configuration.
        rank: 0 serves; ranks > 0 load only the TRT-LLM model(s) explicitly and open no endpoint.
    """
    ep = config.endpoints
    argv = [str(install.server), f"--model-repository={config.repo}", "--disable-auto-complete-config"]
    if install.backend_dir is not None:
        argv.append(f"--backend-directory={install.backend_dir}")
    if rank == 0:
        argv += [f"--http-address={ep.host}", f"--http-port={ep.http_port}",
                 f"--grpc-address={ep.host}", f"--grpc-port={ep.grpc_port}",
                 f"--metrics-address={ep.host}", f"--metrics-port={ep.metrics_port}",
                 "--strict-readiness=true", f"--log-verbose={config.log_verbose}"]
        if config.restricted_token:
            restriction = f"{','.join(config.restricted_apis())}:{RESTRICTED_HEADER}={config.restricted_token}"
            argv += [f"--http-restricted-api={restriction}", f"--grpc-restricted-protocol={restriction}"]
    else:
        argv += ["--allow-http=false", "--allow-grpc=false", "--allow-metrics=false",
                 "--model-control-mode=explicit", *(f"--load-model={name}" for name in config.trtllm_models)]
    argv += ["--exit-on-error=true", f"--exit-timeout-secs={config.exit_timeout_s}",
             f"--backend-config=python,shm-region-prefix-name={config.rank_shm_prefix(rank)}",
             f"--backend-config=python,shm-default-byte-size={PYTHON_SHM_DEFAULT_BYTES}",
             f"--backend-config=python,shm-growth-byte-size={PYTHON_SHM_GROWTH_BYTES}",
             f"--backend-config=python,thread-pool-size={PYTHON_THREAD_POOL_SIZE}"]
    if install.source == "nvidia-pytriton":  # the CPU build: no NVML, no pinned host memory
        argv += ["--allow-gpu-metrics=false", "--pinned-memory-pool-byte-size=0"]
    return argv + list(config.extra_args)


def grpc_headers(token: str | None) -> tuple[tuple[str, str], ...]:
    """The gRPC metadata that carries ``token`` to Triton's restricted protocols (none without a token)."""
    return ((GRPC_RESTRICTED_HEADER, token),) if token else ()


def http_headers(token: str | None) -> dict[str, str]:
    """The HTTP headers that carry ``token`` to Triton's restricted APIs (none without a token)."""
    return {RESTRICTED_HEADER: token} if token else {}


def launch_argv(install: TritonInstall, config: LaunchConfig, *, mpirun: str = "mpirun",
                is_root: bool | None = None) -> list[str]:
    """The whole command: ``tritonserver …`` for one rank, else ``mpirun -n 1 … : -n 1 …`` (one entry per rank).

    Arguments:
        install: the located server.
        config: the launch configuration.
        mpirun: the ``mpirun`` executable for world size > 1.
        is_root: whether the launch runs as root (``--allow-run-as-root``); detected when omitted.
    """
    if config.world_size == 1:
        return rank_argv(install, config, 0)
    is_root = os.geteuid() == 0 if is_root is None else is_root
    argv = [mpirun, *(["--allow-run-as-root"] if is_root else [])]
    for rank in range(config.world_size):
        argv += [*([":"] if rank else []), "-n", "1", *rank_argv(install, config, rank)]
    return argv


def check_ports_free(host: str, ports: dict[str, int]) -> None:
    """Refuse to start when a port is taken, naming the process that holds it when it can be found.

    Arguments:
        host: the bind address.
        ports: ``{"HTTP": 8000, ...}``, the names used in the message.
    """
    for name, port in ports.items():
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError as exc:
                holder = port_holder(port)
                by = f" by {holder}" if holder else ""
                flag = "--openai-port" if name == "OpenAI" else f"--{name.lower()}-port"
                raise KitUsageError(f"{name} port {port} on {host} is in use{by} ({exc.strerror}); stop that "
                                    f"process or choose another port with {flag}.") from None


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel reports free on ``host`` right now (for tests, benchmarks and private listeners), chosen
    below the kernel's ephemeral range where there is room: there no outgoing connection can take it between this
    look and its listener's bind."""
    low = _ephemeral_low()
    for _ in range(PORT_TRIES):
        port = _PORT_CHOICE.randrange(LOWEST_FREE_PORT, low) if low - LOWEST_FREE_PORT >= 1024 else 0
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise KitError(f"no free port on {host} after {PORT_TRIES} tries; free some ports, or name the ports to use")


def _ephemeral_low() -> int:
    """The first port the kernel hands to outgoing connections (32768 when it cannot be read)."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_endpoints(host: str = "127.0.0.1") -> Endpoints:
    """Three distinct free ports on ``host``."""
    ports: list[int] = []
    while len(ports) < 3:
        port = free_port(host)
        if port not in ports:
            ports.append(port)
    return Endpoints(host, *ports)
