"""``trtllm-kit serve OUT --disagg --server trtllm-serve``: upstream's single-node disaggregated serving.

Three processes, started, made ready and stopped as one service: a context and a generation ``trtllm-serve``
worker (the artifact's recorded command on a free loopback port each, ``CUDA_VISIBLE_DEVICES`` from
``--context-gpu-device-ids`` / ``--generation-gpu-device-ids``, each with its own copy of the LLM-API options:
``cache_transceiver_config`` on both, ``disable_overlap_scheduler: true`` on the context server, as upstream
requires) and ``trtllm-serve disaggregated -c disagg_config.yaml`` on ``--openai-port``, whose config names the
two workers' URLs. Ready is every worker's and then the orchestrator's ``GET /health`` answering 200.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from trtllm_kit.errors import KitError, KitUsageError
from trtllm_kit.serve.disagg.roles import ROLES, check_disagg, transceiver_options
from trtllm_kit.serve.options import ServeOptions
from trtllm_kit.serve.server.group import ProcessGroup
from trtllm_kit.serve.server.launcher import check_ports_free, free_port
from trtllm_kit.serve.server.state import claim_run_dir, clear_run, serving_pid, write_pid, write_state
from trtllm_kit.serve.server.stop_signals import stop_requests
from trtllm_kit.serve.server.trtllm_serve import INSTALL_HINT, SERVER, answers, launch_argv

OPTIONS_FLAG = "--extra_llm_api_options"
CONFIG_FILE = "disagg_config.yaml"
ROLE_OPTIONS = {"context": {"disable_overlap_scheduler": True}, "generation": {}}
SERVER_KEYS = {"context": "context_servers", "generation": "generation_servers"}


def role_options(recorded: dict[str, Any], role: str, timeout_s: float) -> dict[str, Any]:
    """One role's LLM-API options: the artifact's, with the cache transceiver and the role's own settings.

    Arguments:
        recorded: the artifact's ``extra_llm_api_options.yaml``; role: ``context`` or ``generation``;
        timeout_s: ``--kv-transfer-timeout``.
    """
    return {**transceiver_options(recorded, timeout_s), **ROLE_OPTIONS[role]}


def disagg_config(host: str, port: int, urls: dict[str, str]) -> dict[str, Any]:
    """``trtllm-serve disaggregated``'s config: where it listens and one worker URL per role.

    Arguments:
        host, port: the orchestrator's bind address and port; urls: role → ``host:port`` of its worker.
    """
    config: dict[str, Any] = {"hostname": host, "port": port, "backend": "pytorch"}
    for role in ROLES:
        config[SERVER_KEYS[role]] = {"num_instances": 1, "urls": [urls[role]], "router": {"type": "round_robin"}}
    return config


def worker_argv(out: Path, host: str, port: int, options: Path) -> list[str]:
    """A role's worker command: the recorded one on ``host:port`` with the role's options file.

    Arguments:
        out: the artifact; host, port: where the worker listens; options: its LLM-API options file.
    """
    argv = launch_argv(out, host, port)
    if OPTIONS_FLAG in argv:
        argv[argv.index(OPTIONS_FLAG) + 1] = str(options)
    else:
        argv += [OPTIONS_FLAG, str(options)]
    return argv


def serve_disaggregated_trtllm(options: ServeOptions, on_ready: Callable[[dict[str, Any]], None] | None) -> None:
    """Run both workers and the orchestrator until SIGINT/SIGTERM or until one of them exits (``KitError``).

    Arguments:
        options: the serve; on_ready: called once with the state when all three answer on /health.
    """
    check_disagg(options)
    settings, out, host = options.settings, options.out, options.endpoints.host
    binary = shutil.which(SERVER)
    if binary is None:
        raise KitError(f"{SERVER} is not on PATH, so {out} cannot be served with --disagg --server {SERVER}; "
                       f"{INSTALL_HINT}.")
    holder = serving_pid(out)
    if holder is not None:
        raise KitUsageError(f"{out} is already served by pid {holder}; run trtllm-kit stop {out}.")
    assert settings.openai_port is not None
    check_ports_free(host, {"OpenAI": settings.openai_port})
    state_dir = claim_run_dir(out)
    recorded = launch_argv(out, host, 0)
    source = Path(recorded[recorded.index(OPTIONS_FLAG) + 1]) if OPTIONS_FLAG in recorded else None
    values = yaml.safe_load(source.read_text()) if source is not None else {}
    client_host = options.endpoints.client_host
    ports = {role: free_port(client_host) for role in ROLES}
    gpus = {"context": settings.context_gpu_device_ids, "generation": settings.generation_gpu_device_ids}
    commands: dict[str, tuple[list[str], dict[str, str]]] = {}
    for role in ROLES:
        path = state_dir / f"{role}.yaml"
        path.write_text(yaml.safe_dump(role_options(values, role, settings.kv_transfer_timeout_s), sort_keys=False))
        env = dict(os.environ)
        if gpus[role] is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(gpus[role])
        commands[role] = [binary, *worker_argv(out, client_host, ports[role], path)[1:]], env
    config_path = state_dir / CONFIG_FILE
    urls = {role: f"{client_host}:{ports[role]}" for role in ROLES}
    config_path.write_text(yaml.safe_dump(disagg_config(host, settings.openai_port, urls), sort_keys=False))
    commands["orchestrator"] = [binary, "disaggregated", "-c", str(config_path), "-t",
                                str(int(settings.ready_timeout_s))], dict(os.environ)
    health = {**{role: f"http://{urls[role]}/health" for role in ROLES},
              "orchestrator": f"http://{client_host}:{settings.openai_port}/health"}
    with stop_requests() as stop:
        _run(options, state_dir, commands, health, stop, on_ready)


def _run(options: ServeOptions, state_dir: Path, commands: dict[str, tuple[list[str], dict[str, str]]],
         health: dict[str, str], stop: threading.Event, on_ready: Callable[[dict[str, Any]], None] | None) -> None:
    write_pid(options.out)
    started = time.perf_counter()
    groups = {name: ProcessGroup(state_dir / f"trtllm-serve-{name}.log") for name in commands}
    try:
        for name, (argv, env) in commands.items():
            groups[name].start(argv, env)
        for name, group in groups.items():
            url = health[name]
            not_ready = group.wait_ready(partial(answers, url), options.settings.ready_timeout_s, poll_s=0.2,
                                         stop_requested=stop.is_set)
            if not_ready is not None:
                exited = f"exited with code {not_ready.exit_code}" if not_ready.exit_code is not None else \
                    f"did not answer 200 on {url} within {options.settings.ready_timeout_s:g} s"
                raise KitError(f"the {name} {SERVER} {exited} (log {group.log_path}); last lines:\n"
                               f"{group.log_tail()}")
        if stop.is_set():
            return
        state = {"pid": os.getpid(), "server": SERVER, "disagg": True, "target": "llmapi",
                 "server_pid": groups["orchestrator"].pid, "openai": health["orchestrator"].split("/")[2],
                 **{name: {"pid": groups[name].pid, "argv": commands[name][0], "log": str(groups[name].log_path)}
                    for name in commands},
                 "log": str(groups["orchestrator"].log_path), "ready_s": round(time.perf_counter() - started, 3),
                 "ready": True}
        write_state([options.out], state)
        if on_ready is not None:
            on_ready(state)
        while not stop.is_set():
            for name, group in groups.items():
                if group.proc is not None and group.proc.poll() is not None:
                    raise KitError(f"the {name} {SERVER} exited with code {group.proc.returncode} while serving "
                                   f"(log {group.log_path}).")
            time.sleep(0.1)
    finally:
        for group in reversed(list(groups.values())):
            group.stop(options.settings.exit_timeout_s)
        clear_run([options.out])
