"""``trtllm-kit serve OUT [OUT ...]``: launch, wait, run the frontend, reload on request, shut down.

Several OUTs are served by one tritonserver from one working repository (``serve/fleet/members.py``). The first OUT
owns the serve's run directory (the working repository, the logs, the reload requests); every OUT's run directory
gets the pid file and the state, so ``stop`` and ``reload`` take any of them and a rebuild into any of them is
refused while it is served.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from trtllm_kit.artifact import Artifact
from trtllm_kit.artifact.integrity import check_artifact
from trtllm_kit.errors import KitError, KitUsageError
from trtllm_kit.names import API_KEY_ENV
from trtllm_kit.runtime.heartbeat import HEARTBEAT_ENV
from trtllm_kit.serve.disagg.entry import serve_disaggregated
from trtllm_kit.serve.dynamo.run import serve_dynamo
from trtllm_kit.serve.fleet.fit import check_fit, memory_need
from trtllm_kit.serve.fleet.hotswap import Reloader
from trtllm_kit.serve.fleet.members import plan_members, route, working_repository
from trtllm_kit.serve.fleet.merge import TRTLLM_MODEL
from trtllm_kit.serve.fleet.running import Server, drop_idle_ensemble, route_state
from trtllm_kit.serve.frontend import OpenAIFrontend, start_frontend
from trtllm_kit.serve.openai.config import OpenAIConfig
from trtllm_kit.serve.openai.routes import Alias, Route, check_aliases
from trtllm_kit.serve.options import Endpoints, ServeOptions, parse_names
from trtllm_kit.serve.ray.run import serve_ray
from trtllm_kit.serve.servable import Servable, servable
from trtllm_kit.serve.server.detach import last_detached, serve_detached, stop_serving
from trtllm_kit.serve.server.launcher import LaunchConfig, check_ports_free, grpc_headers, launch_argv
from trtllm_kit.serve.server.locate import locate_tritonserver
from trtllm_kit.serve.server.process import TritonProcess
from trtllm_kit.serve.server.reaper import Reaper
from trtllm_kit.serve.server.state import (
    HEARTBEAT_DIR,
    TRITON_LOG,
    claim_run_dir,
    clear_run,
    fresh_run_dir,
    serving_pid,
    write_pid,
    write_token,
)
from trtllm_kit.serve.server.trtllm_serve import serve_trtllm
from trtllm_kit.serve.server.watch import Watch

__all__ = ["ServeOptions", "last_detached", "serve", "serve_detached", "stop_serving"]

WATCH_S = 0.5  # how often a serving process checks that tritonserver and every stub are alive
LOOPBACK = {False: "127.0.0.1", True: "::1"}


def serve(options: ServeOptions, on_ready: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Launch the server, wait until it is ready, run the OpenAI frontend, and block until SIGINT/SIGTERM.

    Every rank, stub and shared-memory region is gone when this returns or raises, and within seconds when this
    process is killed (a reaper process watches it). When tritonserver or one of its stubs dies while serving, or
    an engine holds requests without a step (or a stub stays stopped) for ``engine_watchdog_s``, in-flight
    requests fail at once and this raises ``KitError`` naming it (``serve`` exits 1 for a supervisor to restart
    it). A tritonserver that aborts while starting is started once more. Triton's repository, shared-memory, trace
    and logging APIs demand a per-launch token that only this process and the owner's ``run_dir/triton.token``
    (mode 0600) hold. With an API key or a key file, every Triton API but health demands it, so the OpenAI port is
    the only way in (with ``--api-key`` Triton's ports also listen on loopback only); the key reaches no child
    process.

    Arguments:
        options: what to serve and where.
        on_ready: called once with the state (endpoints, pids, time to ready) when the server is ready.
    """
    if options.settings.dynamo:
        serve_dynamo(options, on_ready)
        return
    if options.settings.ray:
        serve_ray(options, on_ready)
        return
    if options.settings.disagg:
        serve_disaggregated(options, on_ready)
        return
    if options.settings.server == "trtllm-serve":
        if len(options.outs) > 1:
            raise KitUsageError("--server trtllm-serve serves one OUT; serve several with the default --server "
                                "triton.")
        check_artifact(Artifact.read(options.out), hashes=options.settings.verify)
        serve_trtllm(options, on_ready)
        return
    outs = options.outs
    targets = [servable(out) for out in outs]
    for target in targets:
        check_artifact(target.artifact, hashes=options.settings.verify)
    members = plan_members(targets, parse_names(options.names))
    text_models = [_model(target, options.settings.model) for target in targets]
    aliases = tuple(Alias.parse(text) for text in options.aliases)
    check_aliases(list(aliases), [m.name for m in members])
    if aliases and options.settings.openai_port is None:
        raise KitUsageError("--alias needs the OpenAI frontend; add --openai-port PORT.")
    world_size = _world_size(targets)
    if len(members) > 1:
        check_fit([memory_need(m.name, m.target) for m in members])
    install = locate_tritonserver(options.settings.tritonserver)
    for out in outs:
        holder = serving_pid(out)
        if holder is not None:
            raise KitUsageError(f"{out} is already served by pid {holder}; run trtllm-kit stop {out}.")
    if options.settings.openai_port is not None:
        check_ports_free(options.endpoints.host, {"OpenAI": options.settings.openai_port})
    os.environ.pop(API_KEY_ENV, None)  # read already; no child inherits it
    state_dir = fresh_run_dir(options.out)
    endpoints = options.endpoints
    if options.api_key:
        endpoints = Endpoints(LOOPBACK[":" in endpoints.host], *endpoints.ports().values())
    repo, copies = working_repository(members, state_dir)
    routes = [drop_idle_ensemble(route(m, c, text), c, repo, options.settings.ensemble)
              for m, c, text in zip(members, copies, text_models, strict=True)]
    names = list(dict.fromkeys(name for r in routes for name in r.models))
    config = LaunchConfig(repo=repo, endpoints=endpoints, world_size=world_size,
                          shm_prefix=f"trtllmkit_{os.getpid()}_", log_verbose=options.settings.log_verbose,
                          exit_timeout_s=options.settings.exit_timeout_s,
                          trtllm_models=tuple(dict.fromkeys(c.names[TRTLLM_MODEL] for c in copies
                                                            if TRTLLM_MODEL in c.names)) or (TRTLLM_MODEL,),
                          extra_args=_explicit(names) if world_size == 1 else (),
                          restricted_token=secrets.token_urlsafe(24),
                          restrict_inference=bool(options.api_key or options.settings.api_keys))
    argv = launch_argv(install, config)
    heartbeat_dir = state_dir / HEARTBEAT_DIR
    process = TritonProcess(install, config, state_dir / TRITON_LOG, argv=argv,
                            env={HEARTBEAT_ENV: str(heartbeat_dir)})
    (state_dir / TRITON_LOG).unlink(missing_ok=True)
    assert config.restricted_token is not None
    write_token(state_dir, config.restricted_token)
    for out in outs:
        claim_run_dir(out)
        write_pid(out)
    reaper = Reaper(config.shm_prefix)
    watch = Watch(process, heartbeat_dir, options.settings.engine_watchdog_s)
    try:
        started = time.perf_counter()
        process.start()
        assert process.pid is not None
        reaper.watch(process.pid)  # the server's own session: its group holds every stub
        frontend = _frontend(options, routes, aliases, config)  # tokenizers load while the server starts
        process.wait_ready_or_restart(options.settings.ready_timeout_s, on_restart=reaper.watch)
        process.protect_shm()
        watch.stubs = process.stubs()
        watch.deaths.follow(watch.stubs)
        state = {"pid": os.getpid(), "server_pid": process.pid, "model": routes[0].triton_model,
                 "target": targets[0].target.name, "world_size": world_size, "tritonserver": str(install.server),
                 "source": install.source, "host": endpoints.host, "http": endpoints.url("http"),
                 "grpc": endpoints.url("grpc"), "metrics": endpoints.url("metrics"), "openai": None,
                 "shm_prefix": config.shm_prefix, "log": str(process.log_path), "run_dir": str(state_dir),
                 "outs": [str(out.absolute()) for out in outs], "routes": [route_state(r) for r in routes],
                 "aliases": {a.name: a.split for a in aliases},
                 "stubs": {str(pid): name for pid, name in watch.stubs.items()}}
        server = Server(options, config, watch, frontend, members, routes, state)
        asyncio.run(_run(server, started, on_ready))
    finally:
        with _signals_ignored():
            process.stop(stubs=watch.stubs, is_idle=watch.engines_idle)
            reaper.close()
            clear_run(outs)


def _explicit(models: list[str]) -> tuple[str, ...]:
    """Explicit model control, every model loaded at start: a reload loads and unloads through Triton's API."""
    return ("--model-control-mode=explicit", *(f"--load-model={name}" for name in models))


def _world_size(targets: list[Servable]) -> int:
    sizes = {target.world_size for target in targets}
    if len(sizes) > 1:
        found = ", ".join(f"{t.out} {t.world_size}" for t in targets)
        raise KitUsageError(f"the OUTs need different numbers of server processes ({found}); one server launches "
                            "one world size: serve them separately.")
    return sizes.pop()


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


def _frontend(options: ServeOptions, routes: list[Route], aliases: tuple[Alias, ...],
              launch: LaunchConfig) -> OpenAIFrontend | None:
    if options.settings.openai_port is None:
        return None
    config = OpenAIConfig(grpc_url=launch.endpoints.url("grpc"), served_name=routes[0].name,
                          triton_model=routes[0].triton_model, api_key=options.api_key,
                          triton_headers=grpc_headers(launch.restricted_token),
                          api_keys=options.settings.api_keys, usage_log=options.settings.usage_log,
                          routes=tuple(routes), aliases=aliases)
    return OpenAIFrontend(config)


async def _run(server: Server, started: float, on_ready: Callable[[dict[str, Any]], None] | None) -> None:
    options, frontend, watch, state = server.options, server.frontend, server.watch, server.state
    process = watch.process
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    reloader = Reloader(server)
    loop.add_signal_handler(signal.SIGUSR1, reloader.requested)
    runner = None
    try:
        if frontend is not None and options.settings.openai_port is not None:
            runner = await start_frontend(frontend, options.endpoints.host, options.settings.openai_port)
            state["openai"] = f"{options.endpoints.url('http').rsplit(':', 1)[0]}:{options.settings.openai_port}"
        state["ready_s"] = round(time.perf_counter() - started, 3)
        state["ready"] = True
        server.write_state()
        if on_ready is not None:
            on_ready(state)
        while not stop.is_set():
            failure = watch.failure()
            if failure is not None:
                process.stop(grace_s=0)  # in-flight requests fail now, not at their clients' timeouts
                raise KitError(f"{failure}; serve stopped so that it can be restarted (log {process.log_path}); "
                               f"last lines:\n{process.log_tail()}")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=WATCH_S)
    finally:
        await reloader.close()
        if runner is not None:
            await runner.cleanup()
        for sig, handler in saved.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, handler)


