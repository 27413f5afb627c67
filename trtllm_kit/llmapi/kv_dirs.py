"""The directories that hold context servers' KV sockets, and their removal once their owner is gone.

A transceiver listens on ``kv.sock`` in a fresh 0700 directory ``<tmp>/trtllm-kit-kv-<tag><random>``. The tag is
``TRTLLM_KIT_KV_DIR_TAG`` from the environment (``serve --disagg`` gives each role one that starts with its
launch's shared-memory prefix, so the serve, and its reaper when the serve is killed, remove the role's
directories as they remove its shared memory). Before a transceiver makes its directory it removes the
directories a killed process left: this user's, whose socket no process listens on any more (or, without a
socket, older than ``UNBOUND_AGE_S``: the owner died between making it and binding).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

KV_DIR_TAG_ENV = "TRTLLM_KIT_KV_DIR_TAG"
DIR_PREFIX = "trtllm-kit-kv-"
SOCKET_NAME = "kv.sock"
UNBOUND_AGE_S = 600.0
TAG = re.compile(r"[A-Za-z0-9_.-]{0,64}")


def dir_tag(environ: Mapping[str, str] = os.environ) -> str:
    """The tag of this process's socket directories (empty when the environment gives none or a malformed one).

    Arguments:
        environ: the process environment.
    """
    tag = environ.get(KV_DIR_TAG_ENV, "")
    return tag if TAG.fullmatch(tag) else ""


def make_socket_dir(tag: str) -> Path:
    """A fresh 0700 directory for a transceiver's socket, after removing the stale ones.

    Arguments:
        tag: from ``dir_tag``.
    """
    remove_stale()
    return Path(tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{tag}"))


def tagged_glob(tag_prefix: str) -> str:
    """The glob pattern of the socket directories whose tag starts with ``tag_prefix``.

    Arguments:
        tag_prefix: e.g. a launch's shared-memory prefix.
    """
    return str(Path(tempfile.gettempdir()) / f"{DIR_PREFIX}{tag_prefix}*")


def remove_tagged(tag_prefix: str) -> list[Path]:
    """Remove this user's socket directories whose tag starts with ``tag_prefix``; the ones removed.

    Arguments:
        tag_prefix: e.g. a launch's shared-memory prefix.
    """
    removed = [path for path in Path(tempfile.gettempdir()).glob(f"{DIR_PREFIX}{tag_prefix}*") if _is_own_dir(path)]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def remove_stale() -> list[Path]:
    """Remove this user's socket directories nobody serves any more; the ones removed."""
    stale = [path for path in Path(tempfile.gettempdir()).glob(f"{DIR_PREFIX}*") if _is_own_dir(path)
             and _is_stale(path)]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def _is_own_dir(path: Path) -> bool:
    try:
        info = path.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()


def _is_stale(path: Path) -> bool:
    sock = path / SOCKET_NAME
    try:
        info = sock.lstat()
    except FileNotFoundError:
        with contextlib.suppress(OSError):
            return time.time() - path.lstat().st_mtime > UNBOUND_AGE_S
        return False
    except OSError:
        return False
    if not stat.S_ISSOCK(info.st_mode):
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(sock))
        except ConnectionRefusedError:  # bound by a process that is gone: nobody listens
            return True
        except OSError:
            return False
    return False
