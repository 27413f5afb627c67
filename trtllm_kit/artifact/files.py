"""File hashes and tool versions of an artifact, and where a checkpoint is inside one."""

from __future__ import annotations

import hashlib
import os
import platform
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

from trtllm_kit import __version__
from trtllm_kit.errors import KitUsageError

TOOLS = ("torch", "transformers", "safetensors", "tokenizers", "numpy", "tensorrt_llm", "tensorrt")


def sha256_file(path: Path, chunk: int = 16 * 1024 * 1024) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def sha256_files(paths: list[Path]) -> list[str]:
    """``sha256_file`` of each path, a file per core at a time (hashlib releases the GIL).

    Arguments:
        paths: the files.
    """
    with ThreadPoolExecutor(max(1, min(len(paths), os.cpu_count() or 1))) as pool:
        return list(pool.map(sha256_file, paths))


def file_hashes(root: Path, known: dict[str, str] | None = None) -> dict[str, str]:
    """sha256 of every file under ``root``, keyed by the path relative to it (``known`` digests are taken as is:
    files of a reused stage)."""
    known = known or {}
    names = [str(p.relative_to(root)) for p in sorted(root.rglob("*")) if p.is_file()]
    fresh = [name for name in names if name not in known]
    digests = dict(zip(fresh, sha256_files([root / name for name in fresh]), strict=True))
    return {name: known[name] if name in known else digests[name] for name in names}


def tool_versions() -> dict[str, str | None]:
    """Versions of the kit, Python and the libraries that shape an artifact (None when absent)."""
    versions: dict[str, str | None] = {"trtllm_kit": __version__, "python": platform.python_version()}
    for name in TOOLS:
        try:
            versions[name] = metadata.version(name.replace("_", "-"))
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def checkpoint_dir(path: Path) -> Path:
    """A TensorRT-LLM checkpoint directory from what the user named: the directory itself or a build's output.

    Arguments:
        path: a checkpoint directory, or a ``trtllm-kit build`` output holding ``checkpoint/``.
    """
    if not path.exists():
        raise KitUsageError(f"{path} does not exist; pass a TensorRT-LLM checkpoint directory or a build's --out.")
    if not (path / "config.json").is_file() and (path / "checkpoint" / "config.json").is_file():
        return path / "checkpoint"
    return path
