"""The unquantized model's answers to verify's inputs, kept in the kit's cache so that another build of the same model
(FP8 after SmoothQuant, a rebuild, ``trtllm-kit verify`` after ``build``) does not run the HF model again.

An entry is one safetensors file, ``<kit cache>/verify-reference/<key digest>.safetensors``: the logits as the HF
model returned them (in their own dtype, so a cached answer equals a fresh one bit for bit), the multiple-choice picks
and the key in its metadata. The key is everything the answers depend on: the sha256 of every file of the HF model
directory (weights, config, tokenizer), the weight and compute dtypes, the prompts, the held-out windows' token ids,
the questions, and the versions of the kit and its libraries. An entry is written to a temporary file and renamed
into place; one that cannot be read, holds another key or has the wrong shapes is computed again and replaced.
The folder is held to ``MAX_CACHE_BYTES``: a read entry is marked used (its mtime), and after a write the least
recently used entries go first until the rest fit (the entry just written always stays).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from trtllm_kit.artifact.files import sha256_files, tool_versions
from trtllm_kit.models.cache_dir import STALE_TMP_SECONDS, cache_root

CACHE_DIR = "verify-reference"
MAX_CACHE_BYTES = 2 * 2**30  # about five SmolLM2-sized entries (400 MB each); a tiny model's is about 8 MB


@dataclass(frozen=True)
class Reference:
    """The HF model's logits [1, T, V] for each prompt and each held-out window (none for an unquantized checkpoint),
    its picks on the multiple-choice set, and whether they came from the cache."""

    prompt_logits: list[torch.Tensor]
    window_logits: list[torch.Tensor]
    picks: tuple[int, ...]
    is_cached: bool = False


def source_sha256(hf_dir: Path) -> str:
    """One sha256 over the relative names and contents of the HF model directory's files (hidden ones aside).

    Arguments:
        hf_dir: the HF model directory.
    """
    names = sorted(str(p.relative_to(hf_dir)) for p in hf_dir.rglob("*")
                   if p.is_file() and not any(part.startswith(".") for part in p.relative_to(hf_dir).parts))
    digest = hashlib.sha256()
    for name, sha in zip(names, sha256_files([hf_dir / name for name in names]), strict=True):
        digest.update(f"{name}\0{sha}\n".encode())
    return digest.hexdigest()


def reference_key(hf_dir: Path, weight_dtype: str, compute_dtype: str, prompts: list[list[int]],
                  windows: list[list[int]], questions: list[Any]) -> dict[str, Any]:
    """What the reference's answers depend on, as JSON-ready values.

    Arguments:
        hf_dir: the HF model; weight_dtype, compute_dtype: the dtypes it is loaded and run in; prompts: token-id
        lists; windows: the held-out windows' token ids (empty for an unquantized checkpoint); questions: the
        multiple-choice set (dataclasses or plain values; empty when not asked).
    """
    def digest(value: Any) -> str:
        return hashlib.sha256(json.dumps(value, default=repr).encode()).hexdigest()

    return {"source_sha256": source_sha256(hf_dir), "weight_dtype": weight_dtype, "compute_dtype": compute_dtype,
            "prompts": digest(prompts), "windows": digest(windows), "questions": digest(questions),
            "versions": tool_versions()}


def entry_path(key: dict[str, Any]) -> Path:
    """The cache file of a key."""
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return cache_root() / CACHE_DIR / f"{name}.safetensors"


def cached_reference(key: dict[str, Any], shape: Callable[[Reference], bool],
                     compute: Callable[[], Reference]) -> Reference:
    """The cached answers for ``key`` when a readable entry of that key has the shapes ``shape`` accepts; else
    ``compute()``, stored for the next time (a cache that cannot be written is left as it is).

    Arguments:
        key: ``reference_key(...)``; shape: whether read answers fit the inputs; compute: runs the HF model.
    """
    path = entry_path(key)
    found = read_entry(path, key)
    if found is not None and shape(found):
        with contextlib.suppress(OSError):
            os.utime(path)  # used now: the last to be evicted
        return found
    reference = compute()
    with contextlib.suppress(OSError):
        write_entry(path, key, reference)
        evict(path.parent, path, MAX_CACHE_BYTES)
    return reference


def read_entry(path: Path, key: dict[str, Any]) -> Reference | None:
    """The entry at ``path`` when it holds ``key``; None when missing, unreadable or of another key."""
    try:
        with safe_open(str(path), framework="pt") as entry:
            metadata = entry.metadata() or {}
            if json.loads(metadata.get("key", "null")) != json.loads(json.dumps(key)):
                return None
            num_prompts, num_windows = int(metadata["num_prompts"]), int(metadata["num_windows"])
            prompts = [entry.get_tensor(f"prompt.{i}") for i in range(num_prompts)]
            windows = [entry.get_tensor(f"window.{i}") for i in range(num_windows)]
            picks = tuple(int(p) for p in json.loads(metadata["picks"]))
    except (OSError, ValueError, KeyError, TypeError, SafetensorError):  # truncated, foreign, bad metadata
        return None
    return Reference(prompts, windows, picks, is_cached=True)


def write_entry(path: Path, key: dict[str, Any], reference: Reference) -> None:
    """``reference`` as the entry of ``key`` at ``path``: a temporary file in the same directory, renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_tmp_files(path.parent)
    tensors = {f"prompt.{i}": t.contiguous() for i, t in enumerate(reference.prompt_logits)}
    tensors |= {f"window.{i}": t.contiguous() for i, t in enumerate(reference.window_logits)}
    metadata = {"key": json.dumps(key), "num_prompts": str(len(reference.prompt_logits)),
                "num_windows": str(len(reference.window_logits)), "picks": json.dumps(list(reference.picks))}
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=metadata)
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
