"""``trtllm-kit reload NAME NEW_OUT``: ask a running serve to swap a served model for a new artifact.

The serve process holds Triton's per-launch token and the frontend's routes, so it does the work
(``serve/fleet/hotswap.py``); this side writes a request file into the serve's run directory (``reloads/ID.json``,
renamed into place), sends the serve SIGUSR1, and waits for ``reloads/ID.result.json``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

from trtllm_kit.errors import KitError, KitUsageError
from trtllm_kit.serve.server.state import REQUESTS_DIR, read_state, serving_pid


def request_reload(served_out: Path, name: str, new_out: Path, timeout_s: float = 600.0, *,
                   force: bool = False) -> dict[str, Any]:
    """Ask the serve of ``served_out`` to serve ``new_out`` as the next version of ``name``; return what happened.

    Raises ``KitUsageError`` when the serve refused (nothing changed), ``KitError`` when the reload failed.

    Arguments:
        served_out: any OUT the running serve serves; name: the served model to replace; new_out: the new
        build output; timeout_s: seconds to wait for the result; force: serve ``new_out`` even when its model
        family, tokenizer or target differs from the served version's.
    """
    pid = serving_pid(served_out)
    state = read_state(served_out) or {}
    if pid is None or not state.get("run_dir"):
        raise KitUsageError(f"no trtllm-kit serve of {served_out} is running; start one with trtllm-kit serve "
                            f"{served_out} --openai-port PORT.")
    requests = Path(state["run_dir"]) / REQUESTS_DIR
    requests.mkdir(parents=True, exist_ok=True)
    ident = uuid.uuid4().hex
    staged = requests / f".{ident}.json"
    staged.write_text(json.dumps({"id": ident, "name": name, "new_out": str(new_out.absolute()),
                                  "force": force}))
    staged.rename(requests / f"{ident}.json")
    os.kill(pid, signal.SIGUSR1)
    result_path = requests / f"{ident}.result.json"
    deadline = time.monotonic() + timeout_s
    while not result_path.is_file():
        if time.monotonic() > deadline:
            raise KitError(f"the serve (pid {pid}) did not answer the reload within {timeout_s:g} s; see its log "
                           f"{state.get('log')}.")
        if serving_pid(served_out) is None:
            raise KitError(f"the serve (pid {pid}) ended before it answered the reload; see its log "
                           f"{state.get('log')}.")
        time.sleep(0.05)
    result = json.loads(result_path.read_text())
    result_path.unlink(missing_ok=True)
    if result.get("error"):
        cls = KitUsageError if result.get("refused") else KitError
        raise cls(result["error"])
    return result


def take_requests(run_dir: Path) -> list[dict[str, Any]]:
    """The pending reload requests in ``run_dir``, oldest first, removed from it.

    Arguments:
        run_dir: the serve's run directory.
    """
    pending = sorted((run_dir / REQUESTS_DIR).glob("[!.]*.json"), key=lambda p: p.stat().st_mtime)
    taken = []
    for path in pending:
        if path.name.endswith(".result.json"):
            continue
        with contextlib.suppress(OSError, ValueError):
            taken.append(json.loads(path.read_text()))
        path.unlink(missing_ok=True)
    return taken


def answer(run_dir: Path, ident: str, result: dict[str, Any]) -> None:
    """Write the result of request ``ident`` (renamed into place, so the waiting side reads it whole).

    Arguments:
        run_dir: the serve's run directory; ident: the request's id; result: what happened, or ``error``.
    """
    staged = run_dir / REQUESTS_DIR / f".{ident}.result.json"
    staged.write_text(json.dumps(result, indent=2) + "\n")
    staged.rename(run_dir / REQUESTS_DIR / f"{ident}.result.json")
