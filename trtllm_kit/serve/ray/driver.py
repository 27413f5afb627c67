"""The process ``serve --ray`` starts in its private network namespace: a private Ray, the Serve application, and
the OpenAI frontend in front of it.

``python -m trtllm_kit.serve.ray.driver OUT --name NAME --ray-dir DIR --listen-fd FD --replicas MIN:MAX
--target-ongoing N --router prefix|pow2 --ready-file PATH [--api-keys FILE] [--usage-log FILE]`` brings loopback up,
starts a Ray head of its own (``ray.init``: its temp directory under DIR, no dashboard), runs the model deployment
(``replica.py``) with Ray Serve's autoscaling, its request router (``routing.py``) and no HTTP proxy of Ray's, and
serves the kit's OpenAI frontend (with the gateway
when a key file is given) on FD: a socket the serve bound on the machine's loopback before it started this
process, the one way in from outside the namespace. The frontend streams through the deployment's handle
(``client.py``). It touches the ready file once the application runs, and on SIGTERM closes the frontend and Ray.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from trtllm_kit.artifact.machine import detect_machine
from trtllm_kit.enums import Router
from trtllm_kit.errors import KitError
from trtllm_kit.serve.fleet.merge import TRTLLM_MODEL
from trtllm_kit.serve.frontend import OpenAIFrontend, start_frontend
from trtllm_kit.serve.openai.artifact_route import artifact_route, route_config
from trtllm_kit.serve.openai.config import OpenAIConfig
from trtllm_kit.serve.openai.routes import Route
from trtllm_kit.serve.ray.client import ReplicaClient
from trtllm_kit.serve.ray.gpu_replica import GpuReplica, artifact_parallel, check_gpu_replicas, deployment_options
from trtllm_kit.serve.ray.head_start import start_head
from trtllm_kit.serve.ray.replica import Replica
from trtllm_kit.serve.ray.routing import artifact_block, router_config
from trtllm_kit.serve.ray.scaling import Autoscaling
from trtllm_kit.serve.server.netns import LOOPBACK_UP

APPLICATION = "trtllm-kit"
DEPLOYMENT = "model"
REPLICA_TITLE = f"ray::ServeReplica:{APPLICATION}:{DEPLOYMENT}"  # the process title Ray gives a replica
LOOPBACK = "127.0.0.1"  # the namespace's only interface
DEFAULT_MAX_ONGOING = 8  # a replica's requests at once when the repository does not say max_batch_size


@dataclass(frozen=True)
class DriverSpec:
    """What the driver serves, and where."""

    out: Path
    name: str
    ray_dir: Path
    listen_fd: int
    scaling: Autoscaling
    router: Router
    ready_file: Path
    api_keys: Path | None = None
    usage_log: Path | None = None
    gpu_replicas: bool = False  # each replica runs trtllm-serve on its GPUs (gpu_replica.py), not the CPU runtime


class RayFrontend(OpenAIFrontend):
    """The OpenAI frontend whose routes stream from the model deployment's replicas.

    Arguments:
        config: the served model and the gateway's files; handle: the model deployment's handle.
    """

    def __init__(self, config: OpenAIConfig, handle: Any) -> None:
        super().__init__(config)
        self.handle = handle

    async def _open(self, _app: web.Application) -> None:
        for route in self.table.routes.values():
            route.client = ReplicaClient(self.handle, DEPLOYMENT)


def model_route(out: Path, name: str) -> Route:
    """The frontend's route to OUT's replicas: an LLM API model (token ids in when the artifact has a tokenizer).

    Arguments:
        out: the artifact; name: the served name.
    """
    return artifact_route(out, name, TRTLLM_MODEL)


def frontend_config(route: Route, api_keys: Path | None = None, usage_log: Path | None = None) -> OpenAIConfig:
    """The OpenAI frontend's configuration in front of the model deployment.

    Arguments:
        route: the model's route (``model_route``); api_keys, usage_log: the gateway's files (None: no gateway).
    """
    return route_config(route, f"ray-serve:{DEPLOYMENT}", api_keys=api_keys, usage_log=usage_log)


def replica_deployment(spec: DriverSpec) -> tuple[type, dict[str, Any], int]:
    """The replica class, its deployment options (the actor's share, a GPU replica's placement group) and the CPUs
    one replica takes.

    Arguments:
        spec: the driver.
    """
    if not spec.gpu_replicas:
        return Replica, {"ray_actor_options": {"num_cpus": 1}}, 1
    tp_size, pp_size = artifact_parallel(spec.out)
    return GpuReplica, deployment_options(tp_size, pp_size), tp_size * pp_size


def start_application(spec: DriverSpec, route: Route) -> Any:
    """Start the private Ray and the model deployment; its handle.

    Arguments:
        spec: the driver; route: the model's route (its ``max_batch_size`` bounds a replica's requests at once).
    """
    import ray
    from ray import serve

    replica, options, num_cpus = replica_deployment(spec)
    start_head(lambda: ray.init(num_cpus=spec.scaling.max_replicas * num_cpus, include_dashboard=False,
                                log_to_driver=False, _temp_dir=str(spec.ray_dir), _node_ip_address=LOOPBACK),
               ray.shutdown)
    serve.start(proxy_location="Disabled")
    max_ongoing = max(route.max_batch_size or DEFAULT_MAX_ONGOING, math.ceil(spec.scaling.target_ongoing))
    deployment = serve.deployment(name=DEPLOYMENT, max_ongoing_requests=max_ongoing,
                                  autoscaling_config=spec.scaling.ray_config(),
                                  request_router_config=router_config(spec.router, artifact_block(spec.out)),
                                  **options)(replica)
    return serve.run(deployment.bind(str(spec.out.absolute())), name=APPLICATION, route_prefix=None)


async def serve_frontend(spec: DriverSpec, route: Route, handle: Any) -> None:
    """Serve the OpenAI frontend on the inherited socket until SIGTERM or SIGINT.

    Arguments:
        spec: the driver; route: the model's route; handle: the model deployment's handle.
    """
    config = frontend_config(route, spec.api_keys, spec.usage_log)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    sock = socket.socket(fileno=spec.listen_fd)
    host, port = sock.getsockname()[:2]
    runner = await start_frontend(RayFrontend(config, handle), host, port, sock=sock)
    try:
        spec.ready_file.parent.mkdir(parents=True, exist_ok=True)
        spec.ready_file.touch()
        await stop.wait()
    finally:
        await runner.cleanup()


def run_driver(spec: DriverSpec) -> None:
    """Start Ray and the application, serve until SIGTERM or SIGINT, then end Ray.

    Arguments:
        spec: the driver.
    """
    import ray

    route = model_route(spec.out, spec.name)
    try:
        handle = start_application(spec, route)
        asyncio.run(serve_frontend(spec, route, handle))
    finally:
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    """The driver process: parse, bring loopback up, run; exit 1 with one sentence on an expected failure.

    Arguments:
        argv: the arguments after the module name (``sys.argv[1:]`` when omitted).
    """
    parser = argparse.ArgumentParser(prog="python -m trtllm_kit.serve.ray.driver")
    parser.add_argument("out", type=Path)
    parser.add_argument("--name", required=True)
    parser.add_argument("--ray-dir", type=Path, required=True)
    parser.add_argument("--listen-fd", type=int, required=True)
    parser.add_argument("--replicas", required=True)
    parser.add_argument("--target-ongoing", type=float, required=True)
    parser.add_argument("--router", type=Router, choices=list(Router), required=True)
    parser.add_argument("--ready-file", type=Path, required=True)
    parser.add_argument("--api-keys", type=Path)
    parser.add_argument("--usage-log", type=Path)
    parser.add_argument("--gpu-replicas", action="store_true")
    args = parser.parse_args(argv)
    try:
        spec = DriverSpec(out=args.out, name=args.name, ray_dir=args.ray_dir, listen_fd=args.listen_fd,
                          scaling=Autoscaling.parse(args.replicas, args.target_ongoing), router=args.router,
                          ready_file=args.ready_file,
                          api_keys=args.api_keys, usage_log=args.usage_log, gpu_replicas=args.gpu_replicas)
        if spec.gpu_replicas:
            check_gpu_replicas(spec.out, detect_machine())
        subprocess.run(LOOPBACK_UP, check=True, capture_output=True)
        run_driver(spec)
    except subprocess.CalledProcessError as exc:
        print(f"Error: {' '.join(LOOPBACK_UP)} exited with code {exc.returncode}: {exc.stderr.decode().strip()}",
              file=sys.stderr)
        return 1
    except KitError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
