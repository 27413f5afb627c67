"""``serve --detach`` and ``stop``: a serve in the background, and its end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from trtllm_kit.errors import KitError, KitUsageError
from trtllm_kit.names import API_KEY_ENV
from trtllm_kit.serve.options import ServeOptions
from trtllm_kit.serve.server.reaper import group_alive, reap
from trtllm_kit.serve.server.state import (
    SERVE_LOG,
    claim_run_dir,
    clear_run,
    is_alive,
    last_detached_file,
    read_state,
    serving_pid,
)


def serve_detached(options: ServeOptions, timeout_s: float | None = None) -> dict[str, Any]:
    """Start ``trtllm-kit serve`` in the background, wait until it is ready, and return its state.

    Arguments:
        options: what to serve and where.
        timeout_s: seconds to wait (the readiness timeout plus 30 s when omitted).
    """
    for out in options.outs:
        holder = serving_pid(out)
        if holder is not None:
            raise KitUsageError(f"{out} is already served by pid {holder}; run trtllm-kit stop {out}.")
    argv = [sys.executable, "-m", "trtllm_kit", "serve", *options.command_line()]
    env = {k: v for k, v in os.environ.items() if k != API_KEY_ENV}
    if options.api_key:
        env[API_KEY_ENV] = options.api_key  # not on the command line, where ps shows it
    log_path = claim_run_dir(options.out) / SERVE_LOG
    clear_run([options.out])  # a state left by a killed serve must not pass for this one's
    with log_path.open("wb") as log:
        child = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    deadline = time.monotonic() + (options.settings.ready_timeout_s + 30 if timeout_s is None else timeout_s)
    while time.monotonic() < deadline:
        state = read_state(options.out)
        if state and state.get("ready") and state.get("pid") == child.pid:
            last_detached_file().parent.mkdir(parents=True, exist_ok=True)
            last_detached_file().write_text(str(options.out.absolute()))
            return state
        if child.poll() is not None:
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
            raise KitError(f"the background serve exited with code {child.returncode} before it was ready (log "
                           f"{log_path}); last lines:\n{tail}")
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGTERM)
    raise KitError(f"the background serve was not ready in time (log {log_path}); it was sent SIGTERM.")


def last_detached() -> Path:
    """The build output that ``serve --detach`` last brought up (what ``trtllm-kit stop`` ends by default)."""
    try:
        return Path(last_detached_file().read_text().strip())
    except OSError:
        raise KitUsageError("no OUT given and no detached serve is recorded; pass the directory given to "
                            "trtllm-kit serve.") from None


def stop_serving(out: Path, timeout_s: float = 30.0) -> dict[str, Any]:
    """End the serve of ``out`` (any of the OUTs it serves): SIGTERM, then SIGKILL of everything it started after
    ``timeout_s``; ``pid`` is None when nothing serves it.

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
        reap({server_pid: None} if server_pid and group_alive(server_pid) else {}, state.get("shm_prefix", ""))
        clear_run([Path(served) for served in state.get("outs") or [str(out)]])
    return {"pid": pid, "forced": forced}
