"""Adapters kept in an artifact: ``OUT/lora/NAME/`` in the target's form (``formats.py``) plus a record in the
manifest.

Each change is atomic: the converted adapter is written into a temporary sibling and renamed into place, and the
manifest (with the new file hashes and the record) is written to a temporary file and renamed over the old one, so
an interrupted ``lora add`` or ``lora remove`` leaves the artifact as it was or as it is meant to be.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_kit.artifact import MANIFEST, AdapterRecord, Artifact
from trtllm_kit.artifact.files import sha256_file
from trtllm_kit.artifact.integrity import file_stats
from trtllm_kit.errors import KitUsageError
from trtllm_kit.jsonfile import read_json
from trtllm_kit.lora.settings import base_config
from trtllm_kit.models.hf_config import read_hf_config
from trtllm_kit.names import CHECKPOINT_DIR, LORA_DIR

if TYPE_CHECKING:
    from trtllm_kit.lora.peft_adapter import PeftAdapter

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # a directory name and an OpenAI model id


def add_adapter(out: Path, name: str, source: Path, *, force: bool = False) -> AdapterRecord:
    """Check the PEFT adapter at ``source`` against the artifact ``out``, convert it for the artifact's target
    (``formats.py``) and record it as ``name``.

    Arguments:
        out: an artifact; name: the adapter's name in it; source: a PEFT adapter directory;
        force: take it even when the base model it records is not the artifact's.
    """
    check_name(name)
    artifact = Artifact.read(out)
    if name in artifact.records.adapters:
        raise KitUsageError(f"{out} already has an adapter named {name!r}; remove it first (trtllm-kit lora remove "
                            f"{out} {name}).")
    adapter = check_adapter(artifact, source, force=force)
    from trtllm_kit.lora.formats import FORMATS  # torch (check_adapter has loaded it)

    fmt = FORMATS[artifact.target]
    rel = f"{LORA_DIR}/{name}"
    staging = out / LORA_DIR / f".{name}.{os.getpid()}.tmp"
    staging.mkdir(parents=True)
    try:
        fmt.write(adapter, staging, artifact.precision.dtype)
        staging.rename(out / rel)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    sha256 = hashlib.sha256(adapter.weights_bytes).hexdigest()  # of the bytes checked, not the path read again
    record = AdapterRecord(name=name, source=str(source.resolve()), sha256=sha256,
                           rank=adapter.rank, alpha=adapter.alpha, target_modules=adapter.target_modules, dir=rel)
    try:
        _write(artifact, {**artifact.records.adapters, name: record})
    except BaseException:
        shutil.rmtree(out / rel, ignore_errors=True)
        raise
    return record


def check_name(name: str) -> None:
    """Refuse an adapter name that is not a directory name and an OpenAI model id."""
    if not NAME.fullmatch(name):
        raise KitUsageError(f"adapter name {name!r:.80} is not valid; use letters, digits, '.', '_' and '-' (at most "
                            "64, starting with a letter or digit).")


def check_adapter(artifact: Artifact, source: Path, *, force: bool = False) -> PeftAdapter:
    """Read the PEFT adapter at ``source`` and check it against ``artifact``: its base model's sizes and name,
    ``max_lora_rank`` and, where the target fixes them at build time, its LoRA modules.

    Arguments:
        artifact: the base artifact; source: a PEFT adapter directory; force: take it even when the base model it
        records is not the artifact's (``base_model.py``).
    """
    from trtllm_kit.lora.base_model import check_base  # torch: a served frontend loads it on its first adapter load
    from trtllm_kit.lora.formats import FORMATS
    from trtllm_kit.lora.peft_adapter import read_adapter

    adapter = read_adapter(source, base_sizes(artifact.path), artifact.spec.build.max_lora_rank)
    if not force:
        check_base(adapter, artifact)
    if FORMATS[artifact.target].fixed_modules:
        _check_modules(artifact, adapter.target_modules, source)
    return adapter


def base_sizes(out: Path) -> dict[str, Any]:
    """The base's sizes: the TensorRT-LLM checkpoint's ``config.json``, or (llmapi) the unified checkpoint's HF one."""
    checkpoint = read_json(out / CHECKPOINT_DIR / "config.json", f"{out} has no checkpoint/config.json; rebuild it.",
                           KitUsageError)
    return checkpoint if "architecture" in checkpoint else base_config(read_hf_config(out / CHECKPOINT_DIR))


def _check_modules(artifact: Artifact, modules: list[str], source: Path) -> None:
    """Refuse an adapter of modules the artifact's LoRA support (fixed at build time) leaves out."""
    lora = artifact.records.lora
    if lora is None:
        raise KitUsageError(f"{artifact.path} was built without LoRA support, which the {artifact.target} target fixes "
                            "at build time; rebuild it with --lora NAME=DIR or --lora-target-modules.")
    outside = sorted(set(modules) - set(lora.target_modules))
    if outside:
        raise KitUsageError(f"{source} adapts {', '.join(outside)}, but {artifact.path} was built for LoRA on "
                            f"{', '.join(lora.target_modules)} only; rebuild with --lora-target-modules naming "
                            "every module the adapters adapt.")


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
        for rel in (k for k in all_stats if k.startswith(f"{record.dir}/")):
            kept[rel] = artifact.files.get(rel) or sha256_file(out / rel)
            stats[rel] = all_stats[rel]
    records = replace(artifact.records, adapters=dict(sorted(adapters.items())))
    updated = replace(artifact, records=records, files=dict(sorted(kept.items())), file_stats=stats)
    tmp = out / f".{MANIFEST}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(updated.to_dict(), indent=2) + "\n")
    tmp.replace(out / MANIFEST)
