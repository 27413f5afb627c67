"""``trtllm-kit serve OUT --disagg`` with tritonserver: a context and a generation tritonserver, each over its own
working copy of OUT's llmapi repository, behind one OpenAI frontend whose route does upstream's two-step request
(``two_step_client.py``).

The generation server takes the serve's ``--http-port``/``--grpc-port``/``--metrics-port``; the context server
free loopback ports (both in the state as ``context``/``generation``). Both demand the same per-launch token, and
each role's ``model.yaml`` gets ``cache_transceiver_config.kv_transfer_timeout_ms`` from
``--kv-transfer-timeout``. Both get, in their environment, a transfer key drawn per launch (the generation server
fetches KV blocks only from endpoints a context server signed with it, ``llmapi/kv_state.py``) and a KV socket
directory tag under the launch's shared-memory prefix: the launch removes such directories before it starts and
after it stops, and its reaper when the serve is killed. On the CPU this checks the wiring of disaggregated
serving; it is not a production engine (docs/disaggregation.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from trtllm_kit.errors import KitError, KitUsageError
from trtllm_kit.llmapi.kv_dirs import KV_DIR_TAG_ENV, remove_tagged, tagged_glob
from trtllm_kit.llmapi.kv_state import KV_KEY_ENV
from trtllm_kit.names import API_KEY_ENV, TRTLLM_MODEL
from trtllm_kit.runtime.heartbeat import HEARTBEAT_ENV
from trtllm_kit.serve.disagg.roles import ROLES, check_disagg, write_transceiver_options
from trtllm_kit.serve.fleet.members import plan_members, route, working_repository
from trtllm_kit.serve.frontend import OpenAIFrontend, start_frontend
from trtllm_kit.serve.openai.config import OpenAIConfig
from trtllm_kit.serve.options import Endpoints, ServeOptions
from trtllm_kit.serve.servable import servable
from trtllm_kit.serve.server.launcher import LaunchConfig, check_ports_free, free_endpoints, grpc_headers
from trtllm_kit.serve.server.locate import locate_tritonserver
from trtllm_kit.serve.server.process import TritonProcess
from trtllm_kit.serve.server.reaper import Reaper
from trtllm_kit.serve.server.state import (
    HEARTBEAT_DIR,
    clear_run,
    fresh_run_dir,
    serving_pid,
    write_pid,
    write_state,
    write_token,
)
from trtllm_kit.serve.server.watch import Watch

WATCH_S = 0.5


def serve_disaggregated_cpu(options: ServeOptions, on_ready: Callable[[dict[str, Any]], None] | None) -> None:
    """Start both roles and the frontend, serve until SIGINT/SIGTERM or until a role dies (``KitError``).

    Arguments:
        options: the serve (``--disagg``); on_ready: called once with the state when both roles answer.
    """
    check_disagg(options)
    settings, out = options.settings, options.out
    target = servable(out)
    install = locate_tritonserver(settings.tritonserver)
    holder = serving_pid(out)
    if holder is not None:
        raise KitUsageError(f"{out} is already served by pid {holder}; run trtllm-kit stop {out}.")
    assert settings.openai_port is not None
    check_ports_free(options.endpoints.host, {"OpenAI": settings.openai_port})
    os.environ.pop(API_KEY_ENV, None)
    state_dir = fresh_run_dir(out)
    token, shm_prefix, kv_key = secrets.token_urlsafe(24), f"trtllmkit_{os.getpid()}_", secrets.token_hex(32)
    remove_tagged(shm_prefix)  # a killed launch of the same pid left them
    endpoints = {"context": free_endpoints(options.endpoints.client_host), "generation": options.endpoints}
    members = plan_members([target], {})
    processes: dict[str, TritonProcess] = {}
    for role in ROLES:
        repo, copies = working_repository(members, state_dir / role)
        write_transceiver_options(repo / TRTLLM_MODEL / "1" / "model.yaml", settings.kv_transfer_timeout_s)
        config = LaunchConfig(repo=repo, endpoints=endpoints[role], shm_prefix=f"{shm_prefix}{role[0]}",
                              log_verbose=settings.log_verbose, exit_timeout_s=settings.exit_timeout_s,
                              restricted_token=token, restrict_inference=bool(options.api_key or settings.api_keys))
        processes[role] = TritonProcess(install, config, state_dir / f"triton-{role}.log",
                                        env={HEARTBEAT_ENV: str(state_dir / HEARTBEAT_DIR), KV_KEY_ENV: kv_key,
                                             KV_DIR_TAG_ENV: f"{shm_prefix}{role[0]}-"})
    served = replace(route(members[0], copies[0], target.models[0]),
                     context_grpc_url=endpoints["context"].url("grpc"))
    write_token(state_dir, token)
    write_pid(out)
    reaper = Reaper(shm_prefix, (tagged_glob(shm_prefix),))
    watches = {role: Watch(process, state_dir / HEARTBEAT_DIR, settings.engine_watchdog_s)
               for role, process in processes.items()}
    try:
        started = time.perf_counter()
        for process in processes.values():
            process.start()
            assert process.pid is not None
            reaper.watch(process.pid)
        frontend = OpenAIFrontend(OpenAIConfig(
            grpc_url=endpoints["generation"].url("grpc"), served_name=served.name, triton_model=served.triton_model,
            api_key=options.api_key, triton_headers=grpc_headers(token), api_keys=settings.api_keys,
            usage_log=settings.usage_log, routes=(served,)))
        for process in processes.values():
            process.wait_ready_or_restart(settings.ready_timeout_s, on_restart=reaper.watch)
            process.protect_shm()
        for role, watch in watches.items():
            watch.stubs = processes[role].stubs()
        state = {"pid": os.getpid(), "server": "triton", "disagg": True, "target": target.target.name,
                 "model": served.triton_model, "host": options.endpoints.host, "run_dir": str(state_dir),
                 "outs": [str(out.absolute())], "shm_prefix": shm_prefix,
                 **{role: _role_state(processes[role], endpoints[role]) for role in ROLES},
                 "server_pid": processes["generation"].pid, "http": endpoints["generation"].url("http"),
                 "grpc": endpoints["generation"].url("grpc"), "metrics": endpoints["generation"].url("metrics"),
                 "log": str(processes["generation"].log_path)}
        asyncio.run(_run(options, frontend, watches, state, started, on_ready))
    finally:
        for role, process in processes.items():
            process.stop(stubs=watches[role].stubs, is_idle=watches[role].engines_idle)
        remove_tagged(shm_prefix)
        reaper.close()
        clear_run([out])


def _role_state(process: TritonProcess, endpoints: Endpoints) -> dict[str, Any]:
    return {"pid": process.pid, "http": endpoints.url("http"), "grpc": endpoints.url("grpc"),
            "metrics": endpoints.url("metrics"), "log": str(process.log_path)}


async def _run(options: ServeOptions, frontend: OpenAIFrontend, watches: dict[str, Watch], state: dict[str, Any],
               started: float, on_ready: Callable[[dict[str, Any]], None] | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in saved:
        loop.add_signal_handler(sig, stop.set)
    assert options.settings.openai_port is not None
    runner = await start_frontend(frontend, options.endpoints.host, options.settings.openai_port)
    try:
        state["openai"] = f"{options.endpoints.url('http').rsplit(':', 1)[0]}:{options.settings.openai_port}"
        state["ready_s"], state["ready"] = round(time.perf_counter() - started, 3), True
        write_state([Path(state["outs"][0])], state)
        if on_ready is not None:
            on_ready(state)
        while not stop.is_set():
            for role, watch in watches.items():
                failure = watch.failure()
                if failure is not None:
                    raise KitError(f"the {role} server failed: {failure}; serve --disagg stopped (log "
                                   f"{watch.process.log_path}); last lines:\n{watch.process.log_tail()}")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=WATCH_S)
    finally:
        await runner.cleanup()
        for sig, handler in saved.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, handler)
