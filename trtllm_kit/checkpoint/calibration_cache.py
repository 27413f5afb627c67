"""Calibration statistics kept in the kit's cache, so that another build of the same model with the same calibration
(SmoothQuant after FP8, a rebuild into another directory) does not run the model over the windows again.

An entry is one safetensors file, ``<kit cache>/calibration/<key digest>.safetensors``: the statistics as
``CalibrationStats`` holds them, their parameters and the key in its metadata. The key is everything the statistics
depend on: the sha256 of the model's config, weight and tokenizer files (the weights' as the build took them for the
manifest, so nothing is hashed twice), the calibration parameters as sized for the device (data file's sha256, windows,
tokens per window, seed, compute dtype, the AWQ search), the device, and the versions of the kit and its libraries. An
entry is written to a temporary file and renamed into place; one that cannot be read or holds another key is calibrated
again and replaced. The folder is held to ``MAX_CACHE_BYTES`` as the reference cache is (``reference_cache.evict``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from trtllm_kit.artifact.files import sha256_files, tool_versions
from trtllm_kit.checkpoint.reference_cache import evict, remove_stale_tmp_files
from trtllm_kit.models.cache_dir import cache_root
from trtllm_kit.quant.calibrate import CalibrationStats

CACHE_DIR = "calibration"
MAX_CACHE_BYTES = 2**30  # SmolLM2-135M's statistics take 2.5 MB, a Llama 7B's about 20 MB
CACHED_CALIBRATION = (f"the statistics of an earlier build with the same model and calibration, from the kit's cache "
                      f"({CACHE_DIR}/)")


def calibration_key(inputs: Mapping[str, str], tokenizer_files: Sequence[Path],
                    params: dict[str, Any]) -> dict[str, Any]:
    """What a model's statistics depend on, as JSON-ready values.

    Arguments:
        inputs: the sha256 of the model's config and weight files (and its GGUF file, its calibration text), as the
        build took them for the manifest; tokenizer_files: the model's tokenizer files (they make the windows);
        params: the calibration's parameters as sized for the device (``calibrate.calibration_params``).
    """
    tokenizer = dict(zip((p.name for p in tokenizer_files), sha256_files(list(tokenizer_files)), strict=True))
    return {"inputs": dict(sorted(inputs.items())), "tokenizer": tokenizer, "params": params,
            "versions": tool_versions()}


def entry_path(key: dict[str, Any]) -> Path:
    """The cache file of a key."""
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return cache_root() / CACHE_DIR / f"{name}.safetensors"


def cached_calibration(key: dict[str, Any], compute: Callable[[], CalibrationStats]) -> tuple[CalibrationStats, bool]:
    """The cached statistics of ``key`` when a readable entry holds them, else ``compute()``, stored for the next time
    (a cache that cannot be written is left as it is); and whether they came from the cache.

    Arguments:
        key: ``calibration_key(...)``; compute: calibrates.
    """
    path = entry_path(key)
    found = read_entry(path, key)
    if found is not None:
        with contextlib.suppress(OSError):
            os.utime(path)  # used now: the last to be evicted
        return found, True
    stats = compute()
    with contextlib.suppress(OSError):
        write_entry(path, key, stats)
        evict(path.parent, path, MAX_CACHE_BYTES)
    return stats, False


def read_entry(path: Path, key: dict[str, Any]) -> CalibrationStats | None:
    """The statistics at ``path`` when the entry holds ``key``; None when missing, unreadable or of another key."""
    try:
        with safe_open(str(path), framework="pt") as entry:
            metadata = entry.metadata() or {}
            if json.loads(metadata.get("key", "null")) != json.loads(json.dumps(key)):
                return None
            tensors = {name: entry.get_tensor(name) for name in entry.keys()}  # noqa: SIM118 (not iterable)
            return CalibrationStats.from_tensors(tensors, json.loads(metadata["params"]))
    except (OSError, ValueError, KeyError, TypeError, SafetensorError):  # truncated, foreign, bad metadata
        return None


def write_entry(path: Path, key: dict[str, Any], stats: CalibrationStats) -> None:
    """``stats`` as the entry of ``key`` at ``path``: a temporary file in the same directory, renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_tmp_files(path.parent)
    metadata = {"key": json.dumps(key), "params": json.dumps(stats.params)}
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file(stats.tensors(), tmp, metadata=metadata)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
