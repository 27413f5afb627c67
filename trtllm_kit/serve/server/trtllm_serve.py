"""``trtllm-kit serve OUT --server trtllm-serve``: run the ``trtllm-serve`` command an llmapi artifact records
(its OpenAI server, TensorRT-LLM's PyTorch backend), on the ports of ``[serve]``, until SIGINT/SIGTERM.

The recorded argv is run as written except for three values: the checkpoint and options paths are re-rooted at
OUT (the artifact may have moved) and ``--host``/``--port`` take the serve settings (the port is
``--openai-port`` when given, else ``--http-port``). Ready is ``GET /health`` answering 200.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trtllm_kit.artifact import Artifact
from trtllm_kit.errors import KitError, KitUsageError
from trtllm_kit.http_probe import answers
from trtllm_kit.serve.options import ServeOptions
from trtllm_kit.serve.server.group import ProcessGroup
from trtllm_kit.serve.server.launcher import check_ports_free
from trtllm_kit.serve.server.state import (
    TRTLLM_SERVE_LOG,
    claim_run_dir,
    clear_run,
    serving_pid,
    write_pid,
    write_state,
)
from trtllm_kit.serve.server.stop_signals import stop_requests

SERVER = "trtllm-serve"
INSTALL_HINT = ("install TensorRT-LLM 1.0 or later (pip install tensorrt_llm, or use NVIDIA's Triton TRT-LLM "
                "container) where a GPU is, or serve this artifact with the default --server triton")


def recorded_argv(out: Path) -> list[str]:
    """The ``trtllm-serve`` argv the artifact's manifest records, with its paths re-rooted at ``out``.

    Arguments:
        out: an llmapi build's output directory.
    """
    artifact = Artifact.read(out)
    command = artifact.records.engine.command if artifact.records.engine else None
    if not command or command[0] != SERVER:  # only the llmapi target records a trtllm-serve command
        raise KitUsageError(f"{out} is a target {artifact.target} artifact without a trtllm-serve command; --server "
                            "trtllm-serve serves llmapi builds (trtllm-kit build MODEL --target llmapi).")
    argv = list(command)
    argv[1] = str(out.absolute() / "checkpoint")
    flag = "--extra_llm_api_options"
    if flag in argv:
        index = argv.index(flag) + 1
        argv[index] = str(out.absolute() / Path(argv[index]).parent.name / Path(argv[index]).name)
    return argv


def launch_argv(out: Path, host: str, port: int) -> list[str]:
    """The command line ``serve --server trtllm-serve`` runs: the recorded one on ``host``:``port``.

    Arguments:
        out: the artifact; host, port: where trtllm-serve listens.
    """
    argv = recorded_argv(out)
    for flag, value in (("--host", host), ("--port", str(port))):
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    return argv


def serve_trtllm(options: ServeOptions, on_ready: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Run the artifact's ``trtllm-serve`` command, wait for ``/health``, block until SIGINT/SIGTERM, stop it.

    Arguments:
        options: what to serve and where; on_ready: called once with the state when it answers 200 on /health.
    """
    host, port = options.endpoints.host, options.settings.openai_port or options.endpoints.http_port
    argv = launch_argv(options.out, host, port)
    binary = shutil.which(SERVER)
    if binary is None:
        raise KitError(f"{SERVER} is not on PATH, so {options.out} cannot be served with --server {SERVER}; "
                       f"{INSTALL_HINT}.")
    holder = serving_pid(options.out)
    if holder is not None:
        raise KitUsageError(f"{options.out} is already served by pid {holder}; run trtllm-kit stop {options.out}.")
    check_ports_free(host, {SERVER: port})
    state_dir = claim_run_dir(options.out)
    log_path = state_dir / TRTLLM_SERVE_LOG
    with stop_requests() as stop:
        _serve(options, argv, binary, port, log_path, stop, on_ready)


def _serve(options: ServeOptions, argv: list[str], binary: str, port: int, log_path: Path, stop: threading.Event,
           on_ready: Callable[[dict[str, Any]], None] | None) -> None:
    """``serve_trtllm`` once its checks passed: ``argv`` run by ``binary`` on ``port``, until ``stop`` is set."""
    write_pid(options.out)
    started = time.perf_counter()
    log_path.unlink(missing_ok=True)
    server = ProcessGroup(log_path)
    child = server.start([binary, *argv[1:]])
    try:
        health = f"http://{options.endpoints.client_host}:{port}/health"
        not_ready = server.wait_ready(lambda: answers(health), options.settings.ready_timeout_s, poll_s=0.2,
                                      ports=(port,), stop_requested=stop.is_set)
        if not_ready is not None and not_ready.exit_code is not None:
            raise KitError(f"{SERVER} exited with code {not_ready.exit_code} before it was ready (log {log_path}); "
                           f"last lines:\n{server.log_tail()}")
        if not_ready is not None:
            raise KitError(f"{SERVER} did not answer 200 on {health} within {options.settings.ready_timeout_s:g} s "
                           f"(log {log_path}); raise --ready-timeout or read the log.")
        if stop.is_set():
            return
        state = {"pid": os.getpid(), "server_pid": child.pid, "server": SERVER, "model": "trtllm-serve",
                 "target": "llmapi", "openai": f"{options.endpoints.host}:{port}", "argv": argv,
                 "log": str(log_path),
                 "ready_s": round(time.perf_counter() - started, 3), "ready": True}
        write_state([options.out], state)
        if on_ready is not None:
            on_ready(state)
        while not stop.is_set():
            if child.poll() is not None:
                raise KitError(f"{SERVER} exited with code {child.returncode} while serving (log {log_path}).")
            time.sleep(0.1)
    finally:
        server.stop(options.settings.exit_timeout_s)
        clear_run([options.out])
