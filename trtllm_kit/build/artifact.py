"""Atomic output directories, file hashes and tool versions of an artifact."""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

from trtllm_kit import __version__
from trtllm_kit.artifact.manifest import MANIFEST
from trtllm_kit.errors import KitUsageError

TOOLS = ("torch", "transformers", "safetensors", "tokenizers", "numpy", "tensorrt_llm", "tensorrt")


def check_out_dir(out_dir: Path, *, force: bool) -> None:
    """Refuse an output directory that cannot be written, or that holds files and ``force`` is off.

    Arguments:
        out_dir: the requested output directory.
        force: replace existing contents.
    """
    if out_dir.exists() and not out_dir.is_dir():
        raise KitUsageError(f"--out {out_dir} is a file; choose a directory path.")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not force and not (out_dir / MANIFEST).is_file():
        count = sum(1 for _ in out_dir.iterdir())
        raise KitUsageError(f"--out {out_dir} is not empty ({count} entries); pass --force to replace it or "
                            "choose another directory.")
    parent = _existing_parent(out_dir)
    if not _can_create_in(parent):
        raise KitUsageError(f"--out {out_dir} cannot be created: {parent} is not writable; choose a writable "
                            "location.")


def _can_create_in(directory: Path) -> bool:
    """Try it: ``os.access`` says yes to root even where nothing can be created (/proc, read-only mounts)."""
    try:
        Path(tempfile.mkdtemp(prefix=".trtllm-kit-probe.", dir=directory)).rmdir()
    except OSError:
        return False
    return True


def _existing_parent(path: Path) -> Path:
    path = path.absolute()
    while not path.exists():
        path = path.parent
    return path


@contextmanager
def staged_dir(out_dir: Path, *, force: bool) -> Iterator[Path]:
    """Yield a temporary sibling of ``out_dir``; rename it into place only when the block succeeds.

    On any exception (``KeyboardInterrupt`` included) the temporary directory is removed and ``out_dir``
    keeps what it held before, even when the exception lands between the two renames of a replacement.

    Arguments:
        out_dir: the final directory.
        force: replace an existing ``out_dir``.
    """
    check_out_dir(out_dir, force=force)
    out_dir = out_dir.absolute()
    staging = old = None
    try:
        try:
            out_dir.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".partial", dir=out_dir.parent))
        except OSError as exc:
            raise KitUsageError(f"--out {out_dir} cannot be created ({exc.strerror}); choose a writable "
                                "location.") from None
        umask = os.umask(0)
        os.umask(umask)
        staging.chmod(0o777 & ~umask)
        yield staging
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.{os.getpid()}.old")
            out_dir.rename(old)
        staging.rename(out_dir)
    finally:
        if old is not None and old.exists():
            if out_dir.exists():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.rename(out_dir)
        if staging is not None and staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def sha256_file(path: Path, chunk: int = 16 * 1024 * 1024) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def file_hashes(root: Path, known: dict[str, str] | None = None) -> dict[str, str]:
    """sha256 of every file under ``root``, keyed by the path relative to it (``known`` digests are taken as is:
    files of a reused stage)."""
    known = known or {}
    names = (str(p.relative_to(root)) for p in sorted(root.rglob("*")) if p.is_file())
    return {name: known[name] if name in known else sha256_file(root / name) for name in names}


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
