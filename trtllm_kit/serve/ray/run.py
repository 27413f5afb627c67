"""``trtllm-kit serve OUT --ray``: the artifact as a Ray Serve application on a private Ray, started, made ready,
watched and stopped as one service.

The serve binds the OpenAI port on the machine's loopback, then starts the driver (``driver.py``) in a network
namespace of its own (``server/netns.py``) with that socket as its one way in; Ray, its Serve controller and the
model's replicas all start inside, bound to the namespace's loopback, with their temp directory and HOME under
``RUN_DIR/ray``. The driver's session is a process group the reaper (``server/reaper.py``) is told, so a killed
serve takes the driver and Ray's head with it. Ready is the driver's ready file (the application runs, the
frontend listens). A driver that exits ends the serve (``KitError``); a replica that dies is Ray Serve's to
replace. Stop: SIGTERM to the driver's group, then after ``STOP_GRACE_S`` SIGKILL to every process left in the
namespace: nothing of Ray outlives the serve, and no other Ray on the machine is touched.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trtllm_kit.artifact import Artifact
from trtllm_kit.artifact.machine import detect_machine
from trtllm_kit.errors import KitError, KitUsageError
from trtllm_kit.serve.openai.artifact_route import check_bls_route
from trtllm_kit.serve.options import ServeOptions
from trtllm_kit.serve.ray.gpu_replica import check_gpu_replicas
from trtllm_kit.serve.ray.ray_settings import ray_environment
from trtllm_kit.serve.ray.routing import ray_router
from trtllm_kit.serve.ray.scaling import Autoscaling
from trtllm_kit.serve.server.group import ProcessGroup, kit_environment
from trtllm_kit.serve.server.in_process import claim_artifact, served_name
from trtllm_kit.serve.server.netns import LOOPBACK_UP, PRIVATE_NET, end_namespace, net_namespace
from trtllm_kit.serve.server.reaper import Reaper
from trtllm_kit.serve.server.state import clear_run, write_pid, write_state
from trtllm_kit.serve.server.stop_signals import stop_requests

LOOPBACK = "127.0.0.1"
STOP_GRACE_S = 2.0  # SIGTERM to SIGKILL: the whole stop stays within 3 s
WATCH_S = 0.2
TEMP_PARENT = "trtllm-kit-ray"
INSTALL_HINT = "pip install -c constraints.txt -e '.[ray]'"


def check_ray(options: ServeOptions) -> None:
    """Refuse a ``--ray`` serve this command cannot run, before anything starts.

    Arguments:
        options: the serve.
    """
    settings = options.settings
    if settings.openai_port is None:
        raise KitUsageError("--ray serves the OpenAI frontend in front of Ray Serve; add --openai-port PORT.")
    if len(options.outs) > 1:
        raise KitUsageError(f"--ray serves one OUT, got {len(options.outs)}; serve the others separately.")
    for flag, given in (("--dynamo", settings.dynamo), ("--disagg", settings.disagg),
                        ("--alias", bool(options.aliases)), ("--api-key", bool(options.api_key))):
        if given:
            raise KitUsageError(f"{flag} is not available with --ray; leave it out (keys: --api-keys FILE).")
    Autoscaling.parse(settings.replicas, settings.target_ongoing)
    ray_router(settings.router)
    if settings.gpu_replicas:
        check_gpu_replicas(options.out, detect_machine())
    if importlib.util.find_spec("ray") is None:
        raise KitUsageError(f"--ray needs Ray Serve, and ray is not installed; install it: {INSTALL_HINT}.")
    for tool in (PRIVATE_NET[0], LOOPBACK_UP[0]):
        if shutil.which(tool) is None:
            raise KitUsageError(f"--ray runs Ray in a private network namespace and {tool} is not on PATH; install "
                                "util-linux and iproute2.")


class RayDirs:
    """The serve's Ray state: under its run directory, but for Ray's temp directory, which holds Unix sockets (107
    bytes of path at most) and so lives under the system's temp directory, linked from the run directory.

    Arguments:
        root: ``RUN_DIR/ray``; temp_root: where Ray's temp directories go (the system's temp directory).
    """

    def __init__(self, root: Path, temp_root: Path | None = None) -> None:
        self.root = root
        self.temp_root = (temp_root or Path(tempfile.gettempdir())) / TEMP_PARENT
        self.temp = self.temp_root / root.parent.name.rsplit("-", 1)[-1]  # Ray's --temp-dir: the run dir's key
        self.temp_link = root / "tmp"  # its sessions, sockets and logs, seen from the run directory
        self.home = root / "home"  # HOME: Ray keeps its cluster's token in ~/.ray
        self.ready = root / "ready"
        self.log = root / "driver.log"

    def make(self) -> None:
        """Create the directories afresh (a killed serve's sessions and logs go), owner only."""
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.temp, ignore_errors=True)
        self.home.mkdir(parents=True, mode=0o700)
        self.temp_root.mkdir(mode=0o700, exist_ok=True)
        owner = self.temp_root.stat().st_uid
        if owner != os.getuid():
            raise KitUsageError(f"{self.temp_root} belongs to uid {owner}, not to you; remove it or set TMPDIR.")
        self.temp.mkdir(mode=0o700)
        self.temp_link.symlink_to(self.temp)


def driver_argv(out: Path, name: str, dirs: RayDirs, fd: int, options: ServeOptions) -> list[str]:
    """The driver's command line, in a network namespace of its own.

    Arguments:
        out: the artifact; name: the served name; dirs: the serve's Ray directories; fd: the listening socket;
        options: the serve (``--replicas``, ``--target-ongoing``, ``--router``, the gateway's files).
    """
    settings = options.settings
    argv = [*PRIVATE_NET, sys.executable, "-m", "trtllm_kit.serve.ray.driver", str(out.absolute()), "--name", name,
            "--ray-dir", str(dirs.temp), "--listen-fd", str(fd), "--replicas", settings.replicas,
            "--target-ongoing", f"{settings.target_ongoing:g}", "--router", str(ray_router(settings.router)),
            "--ready-file", str(dirs.ready), *(["--gpu-replicas"] if settings.gpu_replicas else [])]
    for flag, path in (("--api-keys", settings.api_keys), ("--usage-log", settings.usage_log)):
        if path is not None:
            argv += [flag, str(Path(path).absolute())]
    return argv


def listening_socket(port: int) -> socket.socket:
    """A TCP socket bound to loopback ``port`` and listening, for the driver to inherit.

    Arguments:
        port: the OpenAI port.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((LOOPBACK, port))
    except OSError as exc:
        sock.close()
        raise KitUsageError(f"--openai-port {port} cannot be bound on {LOOPBACK}: {exc.strerror}; pick a free "
                            "port.") from None
    sock.listen(1024)
    return sock


def serve_ray(options: ServeOptions, on_ready: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Run the Ray Serve application until SIGINT/SIGTERM, or until the driver exits (``KitError``).

    Arguments:
        options: the serve (``--ray``); on_ready: called once with the state when the frontend answers.
    """
    check_ray(options)
    settings = options.settings
    check_bls_route(options.out)  # the speculative mode named, before the target's refusal
    artifact, run_dir = claim_artifact(options, "--ray", "the kit's CPU LLM")
    assert settings.openai_port is not None
    dirs = RayDirs(run_dir / "ray")
    dirs.make()
    name = served_name(options, artifact)
    sock = listening_socket(settings.openai_port)
    try:
        with stop_requests() as stop:
            _run(options, dirs, name, sock, stop, on_ready)
    finally:
        sock.close()


def _run(options: ServeOptions, dirs: RayDirs, name: str, sock: socket.socket, stop: threading.Event,
         on_ready: Callable[[dict[str, Any]], None] | None) -> None:
    settings, out = options.settings, options.out
    env = {**ray_environment(kit_environment()), "HOME": str(dirs.home)}
    driver = ProcessGroup(dirs.log)
    write_pid(out)
    reaper = Reaper("")
    namespace: int | None = None
    started = time.perf_counter()
    try:
        proc = driver.start(driver_argv(out, name, dirs, sock.fileno(), options), env, pass_fds=(sock.fileno(),))
        reaper.watch(proc.pid)
        not_ready = driver.wait_ready(dirs.ready.exists, settings.ready_timeout_s, poll_s=WATCH_S,
                                      stop_requested=stop.is_set)
        namespace = net_namespace(proc.pid)
        if not_ready is not None:
            raise KitError(
                f"the Ray driver exited with code {not_ready.exit_code} (log {dirs.log}); last lines:\n"
                f"{driver.log_tail()}" if not_ready.exit_code is not None else
                f"{name} was not served by Ray within {settings.ready_timeout_s:g} s (log {dirs.log}); raise "
                "--ready-timeout or read the log.")
        if stop.is_set():
            return
        scaling = Autoscaling.parse(settings.replicas, settings.target_ongoing)
        state = {"pid": os.getpid(), "server": "ray", "model": name, "target": Artifact.read(out).target,
                 "openai": f"{LOOPBACK}:{settings.openai_port}", "server_pid": proc.pid, "log": str(dirs.log),
                 "run_dir": str(dirs.root.parent), "replicas": {"min": scaling.min_replicas,
                                                                "max": scaling.max_replicas},
                 "target_ongoing": scaling.target_ongoing, "router": str(ray_router(settings.router)),
                 "net_namespace": namespace,
                 "ready_s": round(time.perf_counter() - started, 3), "ready": True}
        write_state([out], state)
        if on_ready is not None:
            on_ready(state)
        while not stop.wait(WATCH_S):
            if proc.poll() is not None:
                raise KitError(f"the Ray driver exited with code {proc.returncode} while serving (log {dirs.log}); "
                               f"last lines:\n{driver.log_tail()}")
    finally:
        _stop(driver, namespace)
        reaper.close()
        clear_run([out])


def _stop(driver: ProcessGroup, namespace: int | None) -> None:
    """SIGTERM the driver's group, then after ``STOP_GRACE_S`` SIGKILL it and every process left in its namespace."""
    if driver.proc is None:
        return
    if namespace is None:
        namespace = net_namespace(driver.proc.pid)
    if driver.proc.poll() is None:
        driver.signal(signal.SIGTERM)
    driver.wait_or_kill(STOP_GRACE_S)
    if namespace is not None and namespace != net_namespace(os.getpid()):
        left = end_namespace(namespace)
        if left:
            raise KitError(f"Ray's processes {left} outlived SIGKILL; end them with kill -9 (by pid, never ray stop).")
