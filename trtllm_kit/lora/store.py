"""Adapters kept in an artifact: ``OUT/lora/NAME/adapter.safetensors`` plus a record in the manifest.

Each change is atomic: the converted adapter is written into a temporary sibling and renamed into place, and the
manifest (with the new file hashes and the record) is written to a temporary file and renamed over the old one, so
an interrupted ``lora add`` or ``lora remove`` leaves the artifact as it was or as it is meant to be.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import save_file

from trtllm_kit.artifact import MANIFEST, AdapterRecord, Artifact
from trtllm_kit.artifact.files import sha256_file
from trtllm_kit.artifact.integrity import file_stats
from trtllm_kit.errors import KitUsageError
from trtllm_kit.jsonfile import read_json
from trtllm_kit.lora.peft_adapter import PeftAdapter, read_adapter
from trtllm_kit.names import CHECKPOINT_DIR, LORA_DIR
from trtllm_kit.runtime.lora import ADAPTER_FILE, FUSED_GATE_UP, tensor_names

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # a directory name and an OpenAI model id
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def convert_adapter(artifact: Artifact, source: Path) -> tuple[PeftAdapter, dict[str, torch.Tensor]]:
    """Check the PEFT adapter at ``source`` against ``artifact``'s base model and convert it: per layer and module
    A and B (scale in B) in the checkpoint's dtype, named as ``ADAPTER_FILE`` holds them.

    Arguments:
        artifact: a cpu-target artifact; source: a PEFT adapter directory.
    """
    if artifact.target != "cpu":
        raise KitUsageError(f"{artifact.path} is a {artifact.target} artifact; adapters can be added to cpu "
                            "artifacts so far (build with --target cpu).")
    checkpoint = read_json(artifact.path / CHECKPOINT_DIR / "config.json",
                           f"{artifact.path} has no checkpoint/config.json; rebuild it.", KitUsageError)
    adapter = read_adapter(source, checkpoint, artifact.spec.build.max_lora_rank)
    dtype = TORCH_DTYPES.get(artifact.precision.dtype, torch.float32)
    tensors: dict[str, torch.Tensor] = {}
    for (layer, module), (a, b) in adapter.pairs.items():
        a_name, b_name = tensor_names(layer, module)
        tensors[a_name] = a.to(torch.float32).to(dtype).contiguous()
        if module == FUSED_GATE_UP:  # HF stacks [gate; up], the checkpoint's swiglu fc is [up; gate]
            b = torch.cat(b.chunk(2)[::-1])
        tensors[b_name] = (b.to(torch.float32) * adapter.scale).to(dtype).contiguous()
    return adapter, tensors


def check_name(name: str) -> None:
    """Refuse an adapter name that is not a directory name and an OpenAI model id."""
    if not NAME.fullmatch(name):
        raise KitUsageError(f"adapter name {name!r} is not valid; use letters, digits, '.', '_' and '-' (at most 64, "
                            "starting with a letter or digit).")


def add_adapter(out: Path, name: str, source: Path) -> AdapterRecord:
    """Check the PEFT adapter at ``source`` against the artifact ``out``, convert it, and record it as ``name``.

    Arguments:
        out: a cpu-target artifact; name: the adapter's name in it; source: a PEFT adapter directory.
    """
    check_name(name)
    artifact = Artifact.read(out)
    if name in artifact.records.adapters:
        raise KitUsageError(f"{out} already has an adapter named {name!r}; remove it first (trtllm-kit lora remove "
                            f"{out} {name}).")
    adapter, tensors = convert_adapter(artifact, source)
    rel = f"{LORA_DIR}/{name}"
    staging = out / LORA_DIR / f".{name}.{os.getpid()}.tmp"
    staging.mkdir(parents=True)
    try:
        save_file(tensors, staging / ADAPTER_FILE, metadata={"rank": str(adapter.rank), "alpha": str(adapter.alpha)})
        staging.rename(out / rel)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    record = AdapterRecord(name=name, source=str(source.resolve()), sha256=sha256_file(adapter.weights_path),
                           rank=adapter.rank, alpha=adapter.alpha, target_modules=adapter.target_modules, dir=rel)
    try:
        _write(artifact, {**artifact.records.adapters, name: record})
    except BaseException:
        shutil.rmtree(out / rel, ignore_errors=True)
        raise
    return record


def remove_adapter(out: Path, name: str) -> AdapterRecord:
    """Drop the adapter ``name`` from the artifact ``out`` (the manifest first, then its files).

    Arguments:
        out: the artifact; name: an adapter ``lora add`` recorded.
    """
    artifact = Artifact.read(out)
    record = artifact.records.adapters.get(name)
    if record is None:
        known = ", ".join(artifact.records.adapters) or "none"
        raise KitUsageError(f"{out} has no adapter named {name!r} (it has: {known}); see trtllm-kit lora list {out}.")
    _write(artifact, {k: v for k, v in artifact.records.adapters.items() if k != name})
    shutil.rmtree(out / record.dir, ignore_errors=True)
    return record


def list_adapters(out: Path) -> list[AdapterRecord]:
    """The adapters recorded in the artifact ``out``, by name."""
    return [a for _, a in sorted(Artifact.read(out).records.adapters.items())]


def _write(artifact: Artifact, adapters: dict[str, AdapterRecord]) -> None:
    """Write the manifest with ``adapters`` and the files and stats of their directories, atomically."""
    out = artifact.path
    kept = {k: v for k, v in artifact.files.items() if not k.startswith(f"{LORA_DIR}/")}
    stats = {k: v for k, v in artifact.file_stats.items() if not k.startswith(f"{LORA_DIR}/")}
    all_stats = file_stats(out)
    for record in adapters.values():
        rel = f"{record.dir}/{ADAPTER_FILE}"
        kept[rel] = artifact.files.get(rel) or sha256_file(out / rel)
        stats[rel] = all_stats[rel]
    records = replace(artifact.records, adapters=dict(sorted(adapters.items())))
    updated = replace(artifact, records=records, files=dict(sorted(kept.items())), file_stats=stats)
    tmp = out / f".{MANIFEST}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(updated.to_dict(), indent=2) + "\n")
    tmp.replace(out / MANIFEST)
