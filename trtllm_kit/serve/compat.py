"""What serving a build's output needs, checked against this machine before anything is started."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtllm_kit.build.artifact import read_manifest
from trtllm_kit.build.compat import Machine, compatibility, detect_machine
from trtllm_kit.errors import KitUsageError

# The text models in order of preference: BLS streams in order; the ensemble's responses may overtake each other
# when postprocessing runs several instances.
TEXT_MODELS = ("tensorrt_llm_bls", "ensemble")


@dataclass(frozen=True)
class Servable:
    """A build output ready to launch: its repository, target, world size and tokenizer."""

    out: Path
    repo: Path
    target: str  # "engine" or "cpu"
    world_size: int
    tokenizer_dir: Path | None
    models: tuple[str, ...]  # the public text models the repository holds
    manifest: dict[str, Any]


def servable(out: Path, machine: Machine | None = None) -> Servable:
    """Read ``OUT/manifest.json`` and refuse what cannot be served here (TRT-LLM version, GPU, world size).

    Arguments:
        out: the build's output directory.
        machine: this machine's toolchain and GPUs (detected when omitted, only for engine artifacts).
    """
    if not out.is_dir():
        raise KitUsageError(f"{out} is not a directory; pass a trtllm-kit build output (trtllm-kit build ... --out).")
    manifest = read_manifest(out)
    repo = out / "repo"
    models = tuple(name for name in TEXT_MODELS if (repo / name / "config.pbtxt").is_file())
    if not models:
        raise KitUsageError(f"{repo} holds no tensorrt_llm_bls or ensemble model; rebuild with the repo stage "
                            f"(trtllm-kit build ... --out {out}).")
    engine = (manifest.get("summary") or {}).get("engine") or {}
    world_size = 1  # the CPU runtime runs every rank in one process
    if engine.get("dir"):
        problems = compatibility(manifest, machine or detect_machine())
        if problems:
            raise KitUsageError(f"{out} cannot be served here: {'; '.join(problems)}; rebuild it on this machine "
                                f"(trtllm-kit build ... --out {out} --force) or serve it where it was built.")
        world_size = int(engine.get("world_size", 1))
    tokenizer = out / "tokenizer"
    return Servable(out=out, repo=repo, target="engine" if engine.get("dir") else "cpu", world_size=world_size,
                    tokenizer_dir=tokenizer if tokenizer.is_dir() else None, models=models, manifest=manifest)
