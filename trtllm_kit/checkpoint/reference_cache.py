"""The unquantized model's answers to verify's inputs, kept in the kit's cache so that another build of the same model
(FP8 after SmoothQuant, a rebuild, ``trtllm-kit verify`` after ``build``) does not run the HF model again.

An entry is one safetensors file, ``<kit cache>/verify-reference/<key digest>.safetensors``: the logits as the HF
model returned them (in their own dtype, so a cached answer equals a fresh one bit for bit), the multiple-choice picks
and the key in its metadata. The key is everything the answers depend on: the sha256 of every file of the HF model
directory (weights, config, tokenizer), the weight and compute dtypes, the prompts, the held-out windows' token ids,
the questions, and the versions of the kit and its libraries. An entry is written to a temporary file and renamed
into place; one that cannot be read, holds another key or has the wrong shapes is computed again and replaced.
The folder is held to ``MAX_CACHE_BYTES``, least recently used first (``cache_entries.py``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trtllm_kit.artifact.files import sha256_files, tool_versions
from trtllm_kit.checkpoint import cache_entries
from trtllm_kit.checkpoint.cache_entries import Metadata, Tensors, cached_entry, entry_path

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


def cached_reference(key: dict[str, Any], shape: Callable[[Reference], bool],
                     compute: Callable[[], Reference]) -> Reference:
    """The cached answers for ``key`` when a readable entry of that key has the shapes ``shape`` accepts; else
    ``compute()``, stored for the next time (a cache that cannot be written is left as it is).

    Arguments:
        key: ``reference_key(...)``; shape: whether read answers fit the inputs; compute: runs the HF model.
    """
    def parse(tensors: Tensors, metadata: Metadata) -> Reference | None:
        found = _parse(tensors, metadata)
        return found if shape(found) else None

    return cached_entry(entry_path(CACHE_DIR, key), key, parse, compute, _entry_of, MAX_CACHE_BYTES)[0]


def read_entry(path: Path, key: dict[str, Any]) -> Reference | None:
    """The entry at ``path`` when it holds ``key``; None when missing, unreadable or of another key."""
    return cache_entries.read_entry(path, key, _parse)


def write_entry(path: Path, key: dict[str, Any], reference: Reference) -> None:
    """``reference`` as the entry of ``key`` at ``path``: a temporary file in the same directory, renamed into place."""
    cache_entries.write_entry(path, key, *_entry_of(reference))


def _parse(tensors: Tensors, metadata: Metadata) -> Reference:
    num_prompts, num_windows = int(metadata["num_prompts"]), int(metadata["num_windows"])
    return Reference([tensors[f"prompt.{i}"] for i in range(num_prompts)],
                     [tensors[f"window.{i}"] for i in range(num_windows)],
                     tuple(int(p) for p in json.loads(metadata["picks"])), is_cached=True)


def _entry_of(reference: Reference) -> tuple[Tensors, Metadata]:
    tensors = {f"prompt.{i}": t for i, t in enumerate(reference.prompt_logits)}
    tensors |= {f"window.{i}": t for i, t in enumerate(reference.window_logits)}
    return tensors, {"num_prompts": str(len(reference.prompt_logits)),
                     "num_windows": str(len(reference.window_logits)), "picks": json.dumps(list(reference.picks))}
