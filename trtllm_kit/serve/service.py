"""``trtllm-kit serve OUT`` and ``trtllm-kit stop OUT``: launch, wait, run the frontend, shut down, detach."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_kit.artifact import Artifact
from trtllm_kit.build.integrity import check_artifact
from trtllm_kit.defaults import DEFAULT_READY_TIMEOUT_S
from trtllm_kit.errors import KitError, KitUsageError
from trtllm_kit.serve.compat import Servable, servable
from trtllm_kit.serve.launcher import GRPC_RESTRICTED_HEADER, Endpoints, LaunchConfig, check_ports_free
from trtllm_kit.serve.limits import max_seq_len
from trtllm_kit.serve.locate import locate_tritonserver
from trtllm_kit.serve.process import TritonProcess
from trtllm_kit.serve.reaper import Reaper, group_alive, reap
from trtllm_kit.serve.state import (
    claim_run_dir,
    is_alive,
    read_state,
    run_dir,
    serving_pid,
    working_copy,
    write_pid,
)

if TYPE_CHECKING:
    from trtllm_kit.serve.openai import OpenAIFrontend

API_KEY_ENV = "TRTLLM_KIT_API_KEY"
WATCH_S = 0.5  # how often a serving process checks that tritonserver and every stub are alive
LOOPBACK = {False: "127.0.0.1", True: "::1"}


@dataclass(frozen=True)
class ServeOptions:
    """``trtllm-kit serve`` as a value: what to serve, where, and how long to wait."""

    out: Path
    endpoints: Endpoints = field(default_factory=Endpoints)
    openai_port: int | None = None
    api_key: str | None = None
    api_keys: Path | None = None  # the gateway's key file
    usage_log: Path | None = None
    tritonserver: Path | None = None
    model: str | None = None  # ensemble, or tensorrt_llm_bls; the first the repository has when None
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S
    exit_timeout_s: int = 5
    log_verbose: int = 0
    verify: bool = False  # check every file's sha256 against the manifest (sizes and times are always checked)
    server: str = "triton"  # or trtllm-serve: the llmapi artifact's recorded command (serve/trtllm_serve.py)


def serve(options: ServeOptions, on_ready: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Launch the server, wait until it is ready, run the OpenAI frontend, and block until SIGINT/SIGTERM.

    Every rank, stub and shared-memory region is gone when this returns or raises, and within seconds when this
    process is killed (a reaper process watches it). When tritonserver or one of its stubs dies while serving,
    in-flight requests fail at once and this raises ``KitError`` naming it (``serve`` exits 1 for a supervisor
    to restart it). With an API key, Triton's own ports listen on loopback and demand a per-launch token for
    every API but health, so the OpenAI port is the only way in; the key reaches no child process.

    Arguments:
        options: what to serve and where.
        on_ready: called once with the state (endpoints, pids, time to ready) when the server is ready.
    """
    if options.server == "trtllm-serve":
        from trtllm_kit.serve.trtllm_serve import serve_trtllm

        check_artifact(Artifact.read(options.out), hashes=options.verify)
        serve_trtllm(options, on_ready)
        return
    target = servable(options.out)
    check_artifact(target.artifact, hashes=options.verify)
    model = _model(target, options.model)
    install = locate_tritonserver(options.tritonserver)
    holder = serving_pid(options.out)
    if holder is not None:
        raise KitUsageError(f"{options.out} is already served by pid {holder}; run trtllm-kit stop {options.out}.")
    if options.openai_port is not None:
        check_ports_free(options.endpoints.host, {"OpenAI": options.openai_port})
    os.environ.pop(API_KEY_ENV, None)  # read already; no child inherits it
    state_dir = claim_run_dir(options.out)
    endpoints = options.endpoints
    if options.api_key:
        endpoints = Endpoints(LOOPBACK[":" in endpoints.host], *endpoints.ports().values())
    config = LaunchConfig(repo=working_copy(target.repo, state_dir), endpoints=endpoints,
                          world_size=target.world_size, shm_prefix=f"trtllmkit_{os.getpid()}_",
                          log_verbose=options.log_verbose, exit_timeout_s=options.exit_timeout_s,
                          restricted_token=secrets.token_urlsafe(24) if options.api_key else None)
    process = TritonProcess(install, config, state_dir / "tritonserver.log", argv=target.target.argv(install, config))
    (state_dir / "tritonserver.log").unlink(missing_ok=True)
    write_pid(options.out)
    reaper = Reaper(config.shm_prefix)
    watch = Watch(process)
    try:
        started = time.perf_counter()
        process.start()
        assert process.pid is not None
        reaper.watch(process.pid)  # the server's own session: its group holds every stub
        frontend = _frontend(options, target, model, config)  # the tokenizer loads while the server starts
        process.wait_ready(options.ready_timeout_s)
        process.protect_shm()
        watch.stubs = process.stubs()
        state = {"pid": os.getpid(), "server_pid": process.pid, "model": model, "target": target.target.name,
                 "world_size": target.world_size, "tritonserver": str(install.server), "source": install.source,
                 "host": endpoints.host, "http": endpoints.url("http"), "grpc": endpoints.url("grpc"),
                 "metrics": endpoints.url("metrics"), "openai": None, "shm_prefix": config.shm_prefix,
                 "log": str(process.log_path), "stubs": {str(pid): name for pid, name in watch.stubs.items()}}
        asyncio.run(_run(options, frontend, watch, state, started, on_ready))
    finally:
        with _signals_ignored():
            process.stop(stubs=watch.stubs)
            reaper.close()
            for name in ("state.json", "serve.pid"):
                (state_dir / name).unlink(missing_ok=True)


@dataclass
class Watch:
    """What a serving process checks every ``WATCH_S``: tritonserver and the stubs it had when it was ready."""

    process: TritonProcess
    stubs: dict[int, str] = field(default_factory=dict)

    def failure(self) -> str | None:
        """Why the server cannot serve any more (a process died), or None; new shm regions are made private."""
        self.process.protect_shm()
        proc = self.process.proc
        if proc is not None and proc.poll() is not None:
            return f"tritonserver exited with code {proc.returncode} while serving"
        dead = {pid: name for pid, name in self.stubs.items() if pid not in self.process.stubs()}
        if dead:
            pid, name = next(iter(dead.items()))
            return f"the Python-backend stub of model {name} (pid {pid}) died while serving"
        return None


@contextmanager
def _signals_ignored() -> Iterator[None]:
    """A second Ctrl-C must not cut the shutdown short (it is bounded by the grace period)."""
    saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _model(target: Servable, wanted: str | None) -> str:
    if wanted is None:
        return target.models[0]
    if wanted not in target.models:
        raise KitUsageError(f"--model {wanted} is not in {target.repo}; it has {', '.join(target.models)}.")
    return wanted


def _frontend(options: ServeOptions, target: Servable, model: str, launch: LaunchConfig) -> OpenAIFrontend | None:
    if options.openai_port is None:
        return None
    from trtllm_kit.serve.openai import OpenAIConfig, OpenAIFrontend

    token = launch.restricted_token
    config = OpenAIConfig(grpc_url=launch.endpoints.url("grpc"), served_name=_served_name(target),
                          triton_model=model, tokenizer_dir=target.tokenizer_dir, api_key=options.api_key,
                          max_seq_len=max_seq_len(target.repo),
                          triton_headers=((GRPC_RESTRICTED_HEADER, token),) if token else (),
                          api_keys=options.api_keys, usage_log=options.usage_log)
    return OpenAIFrontend(config)


async def _run(options: ServeOptions, frontend: OpenAIFrontend | None, watch: Watch,
               state: dict[str, Any], started: float, on_ready: Callable[[dict[str, Any]], None] | None) -> None:
    process = watch.process
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in saved:
        loop.add_signal_handler(sig, stop.set)
    runner = None
    try:
        if frontend is not None and options.openai_port is not None:
            from trtllm_kit.serve.openai import start_frontend

            runner = await start_frontend(frontend, options.endpoints.host, options.openai_port)
            state["openai"] = f"{options.endpoints.url('http').rsplit(':', 1)[0]}:{options.openai_port}"
        state["ready_s"] = round(time.perf_counter() - started, 3)
        state["ready"] = True
        (run_dir(options.out) / "state.json").write_text(json.dumps(state, indent=2) + "\n")
        if on_ready is not None:
            on_ready(state)
        while not stop.is_set():
            failure = watch.failure()
            if failure is not None:
                process.stop(stubs=watch.stubs)  # in-flight requests fail now, not at their clients' timeouts
                raise KitError(f"{failure}; serve stopped so that it can be restarted (log {process.log_path}); "
                               f"last lines:\n{process.log_tail()}")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=WATCH_S)
    finally:
        if runner is not None:
            await runner.cleanup()
        for sig, handler in saved.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, handler)


def _served_name(target: Servable) -> str:
    return target.artifact.model_source


def serve_detached(options: ServeOptions, timeout_s: float | None = None) -> dict[str, Any]:
    """Start ``trtllm-kit serve`` in the background, wait until it is ready, and return its state.

    Arguments:
        options: what to serve and where.
        timeout_s: seconds to wait (the readiness timeout plus 30 s when omitted).
    """
    holder = serving_pid(options.out)
    if holder is not None:
        raise KitUsageError(f"{options.out} is already served by pid {holder}; run trtllm-kit stop {options.out}.")
    ep = options.endpoints
    argv = [sys.executable, "-m", "trtllm_kit", "serve", str(options.out),
            "--host", ep.host, "--http-port", str(ep.http_port), "--grpc-port", str(ep.grpc_port),
            "--metrics-port", str(ep.metrics_port), "--ready-timeout", str(options.ready_timeout_s),
            "--log-verbose", str(options.log_verbose)]
    argv += ["--verify"] if options.verify else []
    argv += ["--openai-port", str(options.openai_port)] if options.openai_port is not None else []
    argv += ["--tritonserver", str(options.tritonserver)] if options.tritonserver else []
    argv += ["--model", options.model] if options.model else []
    argv += ["--api-keys", str(options.api_keys.absolute())] if options.api_keys else []
    argv += ["--usage-log", str(options.usage_log.absolute())] if options.usage_log else []
    argv += ["--server", options.server] if options.server != "triton" else []
    env = {k: v for k, v in os.environ.items() if k != API_KEY_ENV}
    if options.api_key:
        env[API_KEY_ENV] = options.api_key  # not on the command line, where ps shows it
    log_path = claim_run_dir(options.out) / "serve.log"
    (run_dir(options.out) / "state.json").unlink(missing_ok=True)
    with log_path.open("wb") as log:
        child = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    deadline = time.monotonic() + (options.ready_timeout_s + 30 if timeout_s is None else timeout_s)
    while time.monotonic() < deadline:
        state = read_state(options.out)
        if state and state.get("ready") and state.get("pid") == child.pid:
            _last_detached_file().parent.mkdir(parents=True, exist_ok=True)
            _last_detached_file().write_text(str(options.out.absolute()))
            return state
        if child.poll() is not None:
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
            raise KitError(f"the background serve exited with code {child.returncode} before it was ready (log "
                           f"{log_path}); last lines:\n{tail}")
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGTERM)
    raise KitError(f"the background serve was not ready in time (log {log_path}); it was sent SIGTERM.")


def _last_detached_file() -> Path:
    from trtllm_kit.serve.locate import kit_cache as cache_root  # torch-free

    return cache_root() / "serve" / "last-detached"


def last_detached() -> Path:
    """The build output that ``serve --detach`` last brought up (what ``trtllm-kit stop`` ends by default)."""
    try:
        return Path(_last_detached_file().read_text().strip())
    except OSError:
        raise KitUsageError("no OUT given and no detached serve is recorded; pass the directory given to "
                            "trtllm-kit serve.") from None


def stop_serving(out: Path, timeout_s: float = 30.0) -> dict[str, Any]:
    """End the serve of ``out`` (SIGTERM, then SIGKILL of everything it started after ``timeout_s``); ``pid`` is
    None when nothing serves it.

    Arguments:
        out: the served build output.
        timeout_s: seconds to wait for a graceful shutdown.
    """
    pid = serving_pid(out)
    if pid is None:
        return {"pid": None, "forced": False}
    state = read_state(out) or {}
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while is_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    forced = is_alive(pid)
    if forced:
        os.kill(pid, signal.SIGKILL)
        server_pid = state.get("server_pid")
        reap([server_pid] if server_pid and group_alive(server_pid) else [], state.get("shm_prefix", ""))
        for name in ("state.json", "serve.pid"):
            (run_dir(out) / name).unlink(missing_ok=True)
    return {"pid": pid, "forced": forced}
