"""Calibration statistics kept in the kit's cache, so that another build of the same model with the same calibration
(SmoothQuant after FP8, a rebuild into another directory) does not run the model over the windows again.

An entry is one safetensors file, ``<kit cache>/calibration/<key digest>.safetensors``: the statistics as
``CalibrationStats`` holds them, their parameters and the key in its metadata. The key is everything the statistics
depend on: the sha256 of the model's config, weight and tokenizer files (the weights' as the build took them for the
manifest, so nothing is hashed twice), the calibration parameters as sized for the device (data file's sha256, windows,
tokens per window, seed, compute dtype, the AWQ search), the device, and the versions of the kit and its libraries. An
entry is written to a temporary file and renamed into place; one that cannot be read or holds another key is calibrated
again and replaced. The folder is held to ``MAX_CACHE_BYTES``, least recently used first (``cache_entries.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from trtllm_kit.artifact.files import sha256_files, tool_versions
from trtllm_kit.checkpoint.cache_entries import Metadata, Tensors, cached_entry, entry_path
from trtllm_kit.quant.calibrate import CalibrationStats

CACHE_DIR = "calibration"
MAX_CACHE_BYTES = 2**30  # SmolLM2-135M's statistics take 2.5 MB, a Llama 7B's about 20 MB by its shapes
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


def cached_calibration(key: dict[str, Any], compute: Callable[[], CalibrationStats]) -> tuple[CalibrationStats, bool]:
    """The cached statistics of ``key`` when a readable entry holds them, else ``compute()``, stored for the next time
    (a cache that cannot be written is left as it is); and whether they came from the cache.

    Arguments:
        key: ``calibration_key(...)``; compute: calibrates.
    """
    def parse(tensors: Tensors, metadata: Metadata) -> CalibrationStats:
        return CalibrationStats.from_tensors(tensors, json.loads(metadata["params"]))

    def entry_of(stats: CalibrationStats) -> tuple[Tensors, Metadata]:
        return stats.tensors(), {"params": json.dumps(stats.params)}

    return cached_entry(entry_path(CACHE_DIR, key), key, parse, compute, entry_of, MAX_CACHE_BYTES)
