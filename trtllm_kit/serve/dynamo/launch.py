"""The processes of ``serve --dynamo`` as command lines and one environment: Dynamo's frontend, the kit's workers.

Everything stays on this machine and under the serve's run directory: discovery is Dynamo's file backend in
``dynamo/discovery``, every plane binds and advertises loopback (``LOOPBACK_ENV``; otherwise a worker advertises
the first interface's address), and ``HOME`` is ``dynamo/home``, where the frontend caches model cards (it reads
``$HOME/.cache/dynamo`` whatever ``XDG_CACHE_HOME`` says).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from trtllm_kit.enums import Router
from trtllm_kit.errors import KitUsageError
from trtllm_kit.serve.server.group import kit_environment
from trtllm_kit.serve.server.netns import PrivateNet

LOOPBACK = "127.0.0.1"
LOOPBACK_ENV = ("DYN_TCP_RPC_HOST", "DYN_EVENT_PLANE_HOST", "DYN_TCP_RESPONSE_STREAM_HOST", "DYN_SYSTEM_HOST")
PLAIN_LOGS = {"NO_COLOR": "1", "DYN_SDK_DISABLE_ANSI_LOGGING": "1"}  # log files without terminal colour codes
NAMESPACE = "trtllm-kit"
DYNAMO_ROUTERS = (Router.KV, Router.ROUND_ROBIN, Router.RANDOM)  # the frontend's --router-mode values
ENDPOINT = f"{NAMESPACE}.worker.generate"  # NAMESPACE.COMPONENT.ENDPOINT, one for every worker of the model
# The KV router's credit for a block a worker has cached, against a block of its load: at Dynamo's 1 a worker one
# request busier than the other loses that request's prefix to it (docs/dynamo.md, "Routing on a bounded cache").
KV_OVERLAP_SCORE_CREDIT = 4
# serve --dynamo's CPU workers: a prompt block left to compute weighs 4 blocks held by running requests in the
# router's cost (Dynamo's prefill load scale): on the CPU runtime a block's prefill takes about 10 times what holding
# a block through a 16-token answer adds to the decode steps (docs/dynamo.md, "Routing on a bounded cache").
CPU_PREFILL_LOAD_SCALE = 4


@dataclass(frozen=True)
class DynamoDirs:
    """The serve's Dynamo state under its run directory.

    Arguments:
        root: ``RUN_DIR/dynamo``.
    """

    root: Path

    @property
    def discovery(self) -> Path:
        return self.root / "discovery"

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def card(self) -> Path:
        return self.root / "card"

    @property
    def ready(self) -> Path:
        return self.root / "ready"

    @property
    def requests(self) -> Path:
        """The workers' ledger of requests in flight (``migration.py``)."""
        return self.root / "requests"

    @property
    def net(self) -> Path:
        """The file naming the serve's private network namespace (``/proc/PID/task/TID/ns/net``) while it serves:
        what reads Dynamo's frontend or the workers' ``/metrics`` joins it (``server/netns.py``)."""
        return self.root / "net"

    def ready_file(self, index: int) -> Path:
        """The file worker ``index`` touches once it is registered."""
        return self.ready / f"worker-{index}"

    def log(self, name: str) -> Path:
        """The log file of process ``name`` (``frontend``, ``worker-0``, ...)."""
        return self.root / f"{name}.log"


def serve_net(root: Path) -> PrivateNet:
    """The private network namespace of the running ``serve --dynamo`` whose ``RUN_DIR/dynamo`` is ``root``,
    joined: Dynamo's frontend and the workers' ``/metrics`` answer there alone (close it when done).

    Arguments:
        root: the serve's ``RUN_DIR/dynamo``.
    """
    named = DynamoDirs(root).net
    try:
        return PrivateNet.join(Path(named.read_text().strip()))
    except OSError as exc:
        raise KitUsageError(f"{named} names no network namespace this user can join ({exc}); pass the RUN_DIR/dynamo "
                            "of a running serve --dynamo, as its user.") from None


def dynamo_env(dirs: DynamoDirs, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of every process of the serve: the kit's, file discovery, loopback planes, a private HOME.

    Arguments:
        dirs: the serve's Dynamo directories; base: the environment to extend (``os.environ`` when omitted).
    """
    env = kit_environment(base)
    env.update({"DYN_DISCOVERY_BACKEND": "file", "DYN_FILE_KV": str(dirs.discovery), "DYN_REQUEST_PLANE": "tcp",
                "HOME": str(dirs.home), **{name: LOOPBACK for name in LOOPBACK_ENV}, **PLAIN_LOGS})
    return env


def router_args(router: Router) -> list[str]:
    """Dynamo's frontend flags for ``router`` (``deploy dynamo``'s): its mode, and for kv the overlap credit.

    Arguments:
        router: one of ``DYNAMO_ROUTERS``.
    """
    credit = ["--router-kv-overlap-score-credit", str(KV_OVERLAP_SCORE_CREDIT)] if router == Router.KV else []
    return ["--router-mode", str(router), *credit]


def cpu_router_args(router: Router) -> list[str]:
    """``serve --dynamo``'s frontend flags for ``router``: ``router_args`` and, for kv, the CPU workers' prefill load
    scale.

    Arguments:
        router: one of ``DYNAMO_ROUTERS``.
    """
    scale = ["--router-prefill-load-scale", str(CPU_PREFILL_LOAD_SCALE)] if router == Router.KV else []
    return [*router_args(router), *scale]


def frontend_argv(port: int, router: Router, migration_limit: int) -> list[str]:
    """Dynamo's OpenAI frontend on loopback ``port``, routing to the kit's CPU workers.

    Arguments:
        port: its HTTP port; router: how it picks a worker; migration_limit: how often a stream may move.
    """
    return [sys.executable, "-m", "dynamo.frontend", "--http-host", LOOPBACK, "--http-port", str(port),
            *cpu_router_args(router), "--migration-limit", str(migration_limit)]


def worker_argv(out: Path, dirs: DynamoDirs, model_name: str, index: int) -> list[str]:
    """The kit's worker ``index`` serving ``out`` as ``model_name`` (``worker.py``).

    Arguments:
        out: the artifact; dirs: the serve's Dynamo directories; model_name: the served name; index: its number.
    """
    return [sys.executable, "-m", "trtllm_kit.serve.dynamo.worker", str(out.absolute()), "--card", str(dirs.card),
            "--model-name", model_name, "--endpoint", ENDPOINT, "--ready-file", str(dirs.ready_file(index)),
            "--requests", str(dirs.requests)]
