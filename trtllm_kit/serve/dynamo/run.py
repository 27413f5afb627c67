"""``trtllm-kit serve OUT --dynamo``: Dynamo's frontend and ``--workers`` kit workers started, made ready, watched
and stopped as one service, behind the kit's OpenAI frontend and gateway.

Dynamo's processes live in a private network namespace (``server/netns.py``: ``PrivateNet``, held by one thread of
the serve, which starts them), loopback its only interface: Dynamo's frontend, the workers' request plane and their
status servers cannot be reached from the machine, only through the kit's frontend, which listens outside on the
OpenAI port and opens its connections to Dynamo's frontend inside. Each process runs in a session of its own
(``server/group.py``) with its log under ``RUN_DIR/dynamo``, and the reaper (``server/reaper.py``) is told every
process group, so nothing outlives a ``serve`` that is killed. Ready is every worker registered (its ready file),
Dynamo's frontend listing the model on ``/v1/models`` on its private loopback port, and the kit's frontend
(``gateway.py``) listening on the OpenAI port, the one public. A worker that dies while serving is logged and the
others carry on (the frontend moves its streams, ``--migration-limit``); the serve fails when the frontend or the
last worker dies. Stop: SIGTERM to every group at once, SIGKILL after ``STOP_GRACE_S``, then SIGKILL to every
process left in the namespace; the kit's frontend closes meanwhile (``FRONTEND_CLOSE_S`` at most).
"""

from __future__ import annotations

import asyncio
import http.client
import importlib.util
import json
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trtllm_kit.artifact import Artifact
from trtllm_kit.errors import KitError, KitUsageError
from trtllm_kit.serve.dynamo.card import write_card
from trtllm_kit.serve.dynamo.discovery import withdraw
from trtllm_kit.serve.dynamo.gateway import FRONTEND_CLOSE_S, DynamoFrontend, dynamo_frontend, serve_in_front
from trtllm_kit.serve.dynamo.launch import DYNAMO_ROUTERS, LOOPBACK, DynamoDirs, dynamo_env, frontend_argv, worker_argv
from trtllm_kit.serve.openai.artifact_route import check_bls_route
from trtllm_kit.serve.options import ServeOptions
from trtllm_kit.serve.server.group import ProcessGroup
from trtllm_kit.serve.server.in_process import claim_artifact, served_name
from trtllm_kit.serve.server.launcher import free_port
from trtllm_kit.serve.server.netns import LOOPBACK_UP, PrivateNet, end_namespace
from trtllm_kit.serve.server.reaper import Reaper
from trtllm_kit.serve.server.state import clear_run, write_pid, write_state
from trtllm_kit.serve.server.stop_signals import stop_requests

LOG = logging.getLogger(__name__)
STOP_GRACE_S = 2.0  # SIGTERM to SIGKILL: the whole stop stays within 3 s
WATCH_S = 0.2
DYNAMO_MODULES = ("dynamo.frontend", "dynamo.llm", "dynamo.runtime")  # the frontend and the worker API
INSTALL_HINT = ("pip install -c constraints.txt -e '.[dynamo]' && pip install -c constraints.txt --no-deps "
                "ai-dynamo==1.6.1")


def check_dynamo(options: ServeOptions) -> None:
    """Refuse a ``--dynamo`` serve this command cannot run, before anything starts.

    Arguments:
        options: the serve.
    """
    settings = options.settings
    if settings.openai_port is None:
        raise KitUsageError("--dynamo serves the OpenAI API in front of Dynamo's frontend; add --openai-port PORT.")
    if len(options.outs) > 1:
        raise KitUsageError(f"--dynamo serves one OUT, got {len(options.outs)}; serve the others separately.")
    if settings.disagg:
        raise KitUsageError("--disagg is not available with --dynamo yet; leave it out.")
    if options.aliases:
        raise KitUsageError(f"--alias {options.aliases[0]} splits requests over two or more served models, and "
                            "--dynamo serves one; leave it out.")
    if settings.router not in DYNAMO_ROUTERS:
        *others, last = (str(router) for router in DYNAMO_ROUTERS)
        raise KitUsageError(f"--router {settings.router} is not one of Dynamo's router modes; give --router "
                            f"{', '.join(others)} or {last} with --dynamo.")
    if shutil.which(LOOPBACK_UP[0]) is None:
        raise KitUsageError(f"--dynamo runs Dynamo in a private network namespace and {LOOPBACK_UP[0]} is not on "
                            "PATH; install iproute2.")
    missing = [module for module in DYNAMO_MODULES if not _importable(module)]
    if missing:
        raise KitUsageError(f"--dynamo needs NVIDIA Dynamo, and {missing[0]} is not installed; install it: "
                            f"{INSTALL_HINT}.")


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # its parent package is missing
        return False


def serve_dynamo(options: ServeOptions, on_ready: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Run the frontend and the workers until SIGINT/SIGTERM, or until the frontend or every worker has exited
    (``KitError``).

    Arguments:
        options: the serve (``--dynamo``); on_ready: called once with the state when the model is listed.
    """
    check_dynamo(options)
    settings, out = options.settings, options.out
    check_bls_route(options.out)  # the speculative mode named, before the target's refusal
    artifact, run_dir = claim_artifact(options, "--dynamo", "the kit's CPU workers")
    assert settings.openai_port is not None
    dirs = DynamoDirs(run_dir / "dynamo")
    shutil.rmtree(dirs.root, ignore_errors=True)  # a killed serve's registrations and logs
    dirs.root.mkdir(mode=0o700)  # registrations, model cards and logs: the owner's alone
    for directory in (dirs.discovery, dirs.home, dirs.ready, dirs.requests):
        directory.mkdir(mode=0o700)
    write_card(out, dirs.card)
    name = served_name(options, artifact)
    net = private_net()
    try:
        dynamo_port = net.call(free_port)  # Dynamo's frontend: the namespace's loopback, behind the kit's
        # made first: a refused key setting or an unreadable key file stops the serve before anything starts
        frontend = dynamo_frontend(options, name, f"http://{LOOPBACK}:{dynamo_port}", net.socket, dirs.root)
        commands = {"frontend": frontend_argv(dynamo_port, settings.router, settings.migration_limit),
                    **{f"worker-{i}": worker_argv(out, dirs, name, i) for i in range(settings.workers)}}
        with stop_requests() as stop:
            _run(options, dirs, name, frontend, commands, net, stop, on_ready)
    finally:
        net.close()


def private_net() -> PrivateNet:
    """The serve's private network namespace; refused in one sentence when this user may not make one."""
    try:
        return PrivateNet.private()
    except (OSError, subprocess.CalledProcessError) as exc:
        raise KitUsageError(f"--dynamo runs Dynamo in a private network namespace, and this user may not make one "
                            f"({exc}); serve as root or with CAP_SYS_ADMIN.") from None


def lists_model(url: str, name: str) -> bool:
    """Whether the frontend at ``url`` lists ``name`` on ``/v1/models``.

    Arguments:
        url: ``http://host:port``; name: the served model name.
    """
    try:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=2) as response:
            listed = json.loads(response.read())
    except (OSError, ValueError, http.client.HTTPException):
        return False
    return any(model.get("id") == name for model in listed.get("data") or [])


def _run(options: ServeOptions, dirs: DynamoDirs, name: str, frontend: DynamoFrontend, commands: dict[str, list[str]],
         net: PrivateNet, stop: threading.Event, on_ready: Callable[[dict[str, Any]], None] | None) -> None:
    settings, out = options.settings, options.out
    assert settings.openai_port is not None
    url = frontend.dynamo_url
    grace_s = STOP_GRACE_S
    env = dynamo_env(dirs)
    groups = {process: ProcessGroup(dirs.log(process)) for process in commands}
    workers = [process for process in commands if process != "frontend"]
    write_pid(out)
    reaper = Reaper("")
    started = time.perf_counter()
    try:
        for process, argv in commands.items():
            reaper.watch(net.call(groups[process].start, argv, env).pid)  # started in the namespace

        def ready() -> bool:
            registered = sum(dirs.ready_file(i).exists() for i in range(len(workers)))
            return registered == len(workers) and net.call(lists_model, url, name)

        def worker_exited() -> str | None:
            for process in workers:
                proc = groups[process].proc
                if proc is not None and proc.poll() is not None:
                    return (f"{process} exited with code {proc.returncode} while starting (log "
                            f"{groups[process].log_path}); last lines:\n{groups[process].log_tail()}")
            return None

        not_ready = groups["frontend"].wait_ready(ready, settings.ready_timeout_s, poll_s=WATCH_S,
                                                  problem=worker_exited, stop_requested=stop.is_set)
        if not_ready is not None:
            theirs = groups["frontend"]
            raise KitError(not_ready.problem or (
                f"Dynamo's frontend exited with code {not_ready.exit_code} (log {theirs.log_path}); last lines:\n"
                f"{theirs.log_tail()}" if not_ready.exit_code is not None else
                f"{name} was not listed on {url}/v1/models by {len(workers)} workers within "
                f"{settings.ready_timeout_s:g} s (logs in {dirs.root}); raise --ready-timeout or read the logs."))
        if stop.is_set():
            return
        state = {"pid": os.getpid(), "server": "dynamo", "model": name, "target": Artifact.read(out).target,
                 "openai": options.endpoints.url("http").rsplit(":", 1)[0] + f":{settings.openai_port}",
                 "dynamo_frontend": url.removeprefix("http://"), "router": str(settings.router),
                 "migration_limit": settings.migration_limit, "net_namespace": net.namespace,
                 "server_pid": groups["frontend"].pid,
                 "log": str(groups["frontend"].log_path), "run_dir": str(dirs.root.parent),
                 "workers": {process: {"pid": groups[process].pid, "log": str(groups[process].log_path)}
                             for process in workers},
                 "ready_s": round(time.perf_counter() - started, 3), "ready": True}

        async def serving() -> None:
            dirs.net.write_text(f"{net.path}\n")
            write_state([out], state)
            if on_ready is not None:
                on_ready(state)
            await _watch(groups, workers, dirs, stop)

        def stopping() -> None:
            nonlocal grace_s
            _terminate(list(groups.values()))
            grace_s = STOP_GRACE_S - FRONTEND_CLOSE_S  # counted from the SIGTERM

        asyncio.run(serve_in_front(frontend, options.endpoints.host, settings.openai_port, serving, stopping))
    finally:
        _stop_all(list(groups.values()), grace_s)
        left = end_namespace(net.namespace)
        reaper.close()
        clear_run([out])
    if left:
        raise KitError(f"Dynamo's processes {left} outlived SIGKILL; end them with kill -9.")


async def _watch(groups: dict[str, ProcessGroup], workers: list[str], dirs: DynamoDirs,
                 stop: threading.Event) -> None:
    """Until a stop is requested: a dead worker is withdrawn from discovery and logged, once; a dead frontend or no
    worker left raises."""
    gone: set[str] = set()
    while not stop.is_set():
        await asyncio.sleep(WATCH_S)
        frontend = groups["frontend"]
        if frontend.proc is not None and frontend.proc.poll() is not None:
            raise KitError(f"Dynamo's frontend exited with code {frontend.proc.returncode} while serving (log "
                           f"{frontend.log_path}); last lines:\n{frontend.log_tail()}")
        for process in workers:
            proc = groups[process].proc
            if process not in gone and proc is not None and proc.poll() is not None:
                gone.add(process)
                withdrawn = withdraw(dirs.discovery, dirs.ready_file(workers.index(process)))
                LOG.warning("%s exited with code %s while serving (log %s), %d discovery entries withdrawn; %d of %d "
                            "workers serve", process, proc.returncode, groups[process].log_path, len(withdrawn),
                            len(workers) - len(gone), len(workers))
        if len(gone) == len(workers):
            raise KitError(f"every worker has exited ({', '.join(sorted(gone))}); serve stopped so that it can be "
                           f"restarted (logs {Path(groups[workers[0]].log_path).parent}).")


def _terminate(groups: list[ProcessGroup]) -> list[ProcessGroup]:
    """SIGTERM every group still running, at once; those groups."""
    running = [group for group in groups if group.proc is not None and group.proc.poll() is None]
    for group in running:
        group.signal(signal.SIGTERM)
    return running


def _stop_all(groups: list[ProcessGroup], grace_s: float) -> None:
    """SIGTERM every group at once, then SIGKILL what is left after ``grace_s``."""
    running = _terminate(groups)
    deadline = time.monotonic() + grace_s
    for group in running:
        group.wait_or_kill(deadline - time.monotonic())
