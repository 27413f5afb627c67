"""Entries of the kit's cache that are one safetensors file each, named by a digest of their key and holding the key
in their metadata (the verify reference, ``reference_cache.py``; calibration statistics, ``calibration_cache.py``).

An entry is written to a temporary file in its folder and renamed into place; one that cannot be read or holds another
key reads as missing. A read marks an entry used (its mtime), and after a write the least recently used entries of the
folder go first until the rest fit its bound (the entry just written always stays).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from trtllm_kit.models.cache_dir import STALE_TMP_SECONDS, cache_root

T = TypeVar("T")
Tensors = dict[str, torch.Tensor]
Metadata = dict[str, str]


def entry_path(folder: str, key: dict[str, Any]) -> Path:
    """The cache file of ``key`` in the kit cache's ``folder``."""
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return cache_root() / folder / f"{name}.safetensors"


def cached_entry(path: Path, key: dict[str, Any], parse: Callable[[Tensors, Metadata], T | None],
                 compute: Callable[[], T], entry_of: Callable[[T], tuple[Tensors, Metadata]],
                 max_bytes: int) -> tuple[T, bool]:
    """The value ``parse`` makes of the entry at ``path`` when it holds ``key`` (and ``parse`` accepts it), else
    ``compute()``, stored for the next time (a cache that cannot be written is left as it is); and whether it came
    from the cache.

    Arguments:
        path: ``entry_path(...)``; key: what the value depends on; parse: the entry's tensors and metadata → the value
        (None, or a ValueError, KeyError or TypeError: not this value's); compute: makes the value; entry_of: the
        value → its tensors and metadata; max_bytes: the folder's bound.
    """
    found = read_entry(path, key, parse)
    if found is not None:
        with contextlib.suppress(OSError):
            os.utime(path)  # used now: the last to be evicted
        return found, True
    value = compute()
    with contextlib.suppress(OSError):
        write_entry(path, key, *entry_of(value))
        evict(path.parent, path, max_bytes)
    return value, False


def read_entry(path: Path, key: dict[str, Any], parse: Callable[[Tensors, Metadata], T | None]) -> T | None:
    """What ``parse`` makes of the entry at ``path`` when it holds ``key``; None when missing, unreadable, of another
    key or refused by ``parse``."""
    try:
        with safe_open(str(path), framework="pt") as entry:
            metadata = entry.metadata() or {}
            if json.loads(metadata.get("key", "null")) != json.loads(json.dumps(key)):
                return None
            tensors = {name: entry.get_tensor(name) for name in entry.keys()}  # noqa: SIM118 (not iterable)
        return parse(tensors, metadata)
    except (OSError, ValueError, KeyError, TypeError, SafetensorError):  # truncated, foreign, bad metadata
        return None


def write_entry(path: Path, key: dict[str, Any], tensors: Tensors, metadata: Metadata) -> None:
    """``tensors`` and ``metadata`` as the entry of ``key`` at ``path``: a temporary file in the same directory, renamed
    into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_tmp_files(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file({name: t.contiguous() for name, t in tensors.items()}, tmp,
                  metadata={**metadata, "key": json.dumps(key)})
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def evict(folder: Path, keep: Path, max_bytes: int) -> list[Path]:
    """Remove the least recently used entries of ``folder`` (oldest mtime first) until its entries take at most
    ``max_bytes``; ``keep`` is never removed. The removed entries.

    Arguments:
        folder: the cache folder; keep: the entry just written; max_bytes: the bound.
    """
    sized = []
    for entry in folder.glob("*.safetensors"):
        with contextlib.suppress(FileNotFoundError):
            stat = entry.stat()
            sized.append((stat.st_mtime, stat.st_size, entry))
    total, removed = sum(size for _, size, _ in sized), []
    for _, size, entry in sorted(sized):
        if total <= max_bytes:
            break
        if entry == keep:
            continue
        with contextlib.suppress(FileNotFoundError):
            entry.unlink()
            removed.append(entry)
        total -= size
    return removed


def remove_stale_tmp_files(folder: Path) -> None:
    """Remove temporary files a killed process left in ``folder`` (older than ``STALE_TMP_SECONDS``)."""
    for stale in folder.glob(".*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            if time.time() - stale.stat().st_mtime > STALE_TMP_SECONDS:
                stale.unlink()
