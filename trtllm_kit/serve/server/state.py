"""Where a running ``trtllm-kit serve`` keeps its pid, state and logs: outside the artifact it serves.

The artifact is a hashed tree (every file is in its manifest), so nothing of a server may be written into
it. A serve of ``OUT`` keeps its files in ``<cache>/run/<name>-<key>/``, where ``<cache>`` is the kit's cache
directory (``$TRTLLM_KIT_CACHE`` or the user cache, e.g. ``~/.cache/trtllm-kit``), ``<name>`` is OUT's
directory name and ``<key>`` the first 16 hex digits of the sha256 of OUT's resolved absolute path; ``target``
in that directory records the path. A rebuild of OUT therefore cannot delete a running server's state, and
``build`` refuses an OUT that is being served.

tritonserver is given a copy of ``OUT/repo`` made there (config files, ``model.py`` files and tokenizers: a
few hundred kB; engines and checkpoints stay where they are, named by absolute path): the Python backend's
stub embeds an interpreter that ignores ``PYTHONDONTWRITEBYTECODE`` and writes ``__pycache__`` beside every
module it imports, which must not land in the hashed tree. A serve of several OUTs keeps one such repository,
merged (``serve/fleet/members.py``), in the first OUT's run directory; each OUT's run directory gets ``serve.pid`` and
``state.json``. The first also gets ``triton.token`` (mode 0600): the per-launch token Triton's restricted APIs
demand, for the owner's own clients (``trtllm-kit generate``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from trtllm_kit.owner import owner_alive, owner_tag

TOKEN_FILE = "triton.token"
STATE_FILE = "state.json"
PID_FILE = "serve.pid"
RUN_FILES = (STATE_FILE, PID_FILE, TOKEN_FILE)  # there only while a serve runs
SERVE_LOG, TRITON_LOG, TRTLLM_SERVE_LOG = "serve.log", "tritonserver.log", "trtllm-serve.log"
REQUESTS_DIR = "reloads"  # reload requests to the running serve (``fleet/reload.py``)
HEARTBEAT_DIR = "heartbeat"  # the engines' beats (``runtime/heartbeat.py``)
PYCACHE = "pycache"  # the bytecode of the processes a serve starts (``pycache_dir``)


def kit_cache() -> Path:
    """``$TRTLLM_KIT_CACHE`` or the user cache directory (as ``models.builtin.cache_root``, without importing torch)."""
    import platformdirs

    override = os.environ.get("TRTLLM_KIT_CACHE")
    return Path(override).expanduser() if override else Path(platformdirs.user_cache_dir("trtllm-kit"))


def pycache_dir() -> Path:
    """Where the Python processes a serve starts write their bytecode (``PYTHONPYCACHEPREFIX``): under the kit's
    cache, by source path, never beside a source, so nothing lands in a hashed artifact or in site-packages."""
    return kit_cache() / PYCACHE


def run_dir(out: Path) -> Path:
    """The directory where a serve of ``out`` keeps its pid file, state and logs.

    Arguments:
        out: the served build output.
    """
    resolved = os.path.realpath(out)
    key = hashlib.sha256(resolved.encode()).hexdigest()[:16]
    return kit_cache() / "run" / f"{Path(resolved).name}-{key}"


def claim_run_dir(out: Path) -> Path:
    """Create ``run_dir(out)`` and record ``out`` in it; return it.

    Arguments:
        out: the served build output.
    """
    directory = run_dir(out)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "target").write_text(os.path.realpath(out) + "\n")
    return directory


def read_state(out: Path) -> dict[str, Any] | None:
    """The state a running serve of ``out`` wrote (pids, endpoints, readiness), or None.

    Arguments:
        out: the served build output.
    """
    try:
        return json.loads((run_dir(out) / STATE_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def is_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not).

    Arguments:
        pid: a process id.
    """
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def write_pid(out: Path) -> None:
    """Record this process as the serve of ``out`` (its pid and start time, so a reused pid is not taken for it).

    Arguments:
        out: the served build output.
    """
    (run_dir(out) / PID_FILE).write_text(owner_tag() + "\n")


def serving_pid(out: Path) -> int | None:
    """The pid of the live ``trtllm-kit serve`` of ``out``, or None.

    Arguments:
        out: a build output.
    """
    try:
        tag = (run_dir(out) / PID_FILE).read_text().strip()
        pid = int(tag.partition("-")[0])
    except (OSError, ValueError):
        return None
    return pid if is_alive(pid) and owner_alive(tag) else None


def write_token(directory: Path, token: str) -> None:
    """Keep ``token`` in ``directory/triton.token``, readable by the owner only (created so from the start).

    Arguments:
        directory: the serve's run directory; token: Triton's per-launch token.
    """
    path = directory / TOKEN_FILE
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(token)


def token_for(grpc_url: str) -> str | None:
    """The per-launch token of the running serve whose Triton gRPC endpoint is ``grpc_url``, when this user can
    read it; None otherwise (a server this kit did not start, or another user's).

    Arguments:
        grpc_url: ``host:port`` as ``state.json`` records it.
    """
    for state_path in sorted((kit_cache() / "run").glob(f"*/{STATE_FILE}")):
        try:
            state = json.loads(state_path.read_text())
            if state.get("grpc") == grpc_url and is_alive(int(state["pid"])):
                return (Path(state["run_dir"]) / TOKEN_FILE).read_text().strip() or None
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def fresh_run_dir(out: Path) -> Path:
    """``claim_run_dir(out)`` without what a serve killed earlier left (reload requests no one waits for, old
    heartbeats), with an empty heartbeat directory (owner only); return the run directory.

    Arguments:
        out: the first served build output.
    """
    directory = claim_run_dir(out)
    for stale in (REQUESTS_DIR, HEARTBEAT_DIR):
        shutil.rmtree(directory / stale, ignore_errors=True)
    (directory / HEARTBEAT_DIR).mkdir(mode=0o700)
    return directory


def write_state(outs: list[Path], state: dict[str, Any]) -> None:
    """Write ``state`` into the run directory of every served OUT (renamed into place: readers see it whole).

    Arguments:
        outs: the served build outputs; state: pids, endpoints, routes, readiness.
    """
    text = json.dumps(state, indent=2) + "\n"
    for out in outs:
        path = run_dir(out) / STATE_FILE
        path.with_suffix(".tmp").write_text(text)
        path.with_suffix(".tmp").replace(path)


def clear_run(outs: list[Path]) -> None:
    """Remove the state, pid and token files of a serve that ended from every OUT's run directory.

    Arguments:
        outs: the build outputs it served.
    """
    for out in outs:
        for name in RUN_FILES:
            (run_dir(out) / name).unlink(missing_ok=True)


def last_detached_file() -> Path:
    """Where ``serve --detach`` records the build output it last brought up (for ``trtllm-kit stop``)."""
    return kit_cache() / "serve" / "last-detached"
