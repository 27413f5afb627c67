"""Output directories written beside their final place and renamed into it, and what an interrupted build left.

A build writes into a staging directory ``.OUT.PID-START.XXXXXX.partial`` next to ``OUT``; ``PID-START`` names
the owning process (its pid and start time in clock ticks, so a reused pid is not mistaken for the owner).
A build killed with SIGKILL cannot remove its staging directory: the next build into the same ``OUT`` removes
every one whose owner is gone (``reclaim_stale``). A replaced ``OUT`` is moved aside to ``.OUT.PID-START.old``
for the instant between the two renames; if its owner died there, the next build puts it back.

A file system that fills up mid-build ends it with ``DiskFullError``, naming the file, the space the build
needs and the space that is free; the build refuses to start when that space is plainly not there.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from trtllm_kit.artifact.manifest import MANIFEST
from trtllm_kit.diskspace import FULL_ERRNOS, DiskFullError, human_size
from trtllm_kit.errors import KitUsageError
from trtllm_kit.interrupts import INTERRUPTS
from trtllm_kit.owner import owner_alive, owner_tag
from trtllm_kit.serve.server.state import serving_pid


def check_out_dir(out_dir: Path, *, force: bool) -> None:
    """Refuse an output directory that cannot be written, that holds files and ``force`` is off, or that a
    running ``trtllm-kit serve`` is serving.

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
    refuse_if_served(out_dir)
    parent = _existing_parent(out_dir)
    if not _can_create_in(parent):
        raise KitUsageError(f"--out {out_dir} cannot be created: {parent} is not writable; choose a writable "
                            "location.")


def refuse_if_served(out_dir: Path) -> None:
    """Refuse to replace an artifact that a running ``trtllm-kit serve`` is serving.

    Arguments:
        out_dir: the requested output directory.
    """
    pid = serving_pid(out_dir)
    if pid is not None:
        raise KitUsageError(f"--out {out_dir} is being served by pid {pid}; stop it first (trtllm-kit stop "
                            f"{out_dir}) or build into another directory.")


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


def reclaim_stale(out_dir: Path) -> list[tuple[Path, int]]:
    """Remove the staging directories of builds into ``out_dir`` whose owner is gone; put back an ``OUT`` that
    a dead build had moved aside. Returns what was removed, with its size in bytes.

    Arguments:
        out_dir: the build's output directory.
    """
    out_dir = out_dir.absolute()
    pattern = re.compile(rf"^\.{re.escape(out_dir.name)}\.(\d+-\d+)\.(?:[^.]+\.partial|old)$")
    removed: list[tuple[Path, int]] = []
    if not out_dir.parent.is_dir():
        return removed
    for path in sorted(out_dir.parent.iterdir()):
        match = pattern.match(path.name)
        if not match or not path.is_dir() or owner_alive(match.group(1)):
            continue
        if path.name.endswith(".old") and not out_dir.exists():
            path.rename(out_dir)
            continue
        size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
        shutil.rmtree(path, ignore_errors=True)
        removed.append((path, size))
    return removed


def check_free_space(out_dir: Path, needed_bytes: int) -> None:
    """Refuse a build that needs more room than the file system of ``out_dir`` has free.

    Arguments:
        out_dir: the build's output directory.
        needed_bytes: what the build will write (an estimate).
    """
    parent = _existing_parent(out_dir)
    free = shutil.disk_usage(parent).free
    if needed_bytes > free:
        raise DiskFullError(f"--out {out_dir} needs about {human_size(needed_bytes)} but the file system of "
                            f"{parent} has {human_size(free)} free; free {human_size(needed_bytes - free)} or choose "
                            "another --out.")


def _disk_full(exc: OSError, staging: Path, out_dir: Path, needed_bytes: int) -> DiskFullError:
    """The sentence for a write that ran out of space: the file (the one named, else the newest in staging)."""
    files = [p for p in staging.rglob("*") if p.is_file()] if staging.exists() else []
    written = sum(p.stat().st_blocks * 512 for p in files)
    # a copy (shutil) names its source in ``filename`` and what it wrote in ``filename2``
    named = [n for n in (exc.filename2, exc.filename) if n and Path(n).is_relative_to(staging)]
    name = named[0] if named else (max(files, key=lambda p: p.stat().st_mtime_ns) if files else staging)
    shown = Path(name).relative_to(staging) if Path(name).is_relative_to(staging) else Path(name)
    free = shutil.disk_usage(out_dir.parent).free + written  # what is free once the staging directory is gone
    needed = f"the build needs about {human_size(needed_bytes)}" if needed_bytes else "the build needs more"
    return DiskFullError(f"no space left on the file system of {out_dir.parent} while writing {shown} "
                         f"({human_size(written)} written): {needed} and {human_size(free)} is free; free space or "
                         "choose another --out.")


@contextmanager
def staged_dir(out_dir: Path, *, force: bool, needed_bytes: int = 0) -> Iterator[Path]:
    """Yield a temporary sibling of ``out_dir``; rename it into place only when the block succeeds.

    On any exception (``KeyboardInterrupt`` included) the temporary directory is removed and ``out_dir``
    keeps what it held before, even when a signal lands between the two renames of a replacement. Staging
    directories of earlier builds whose owner is gone are removed first.

    Arguments:
        out_dir: the final directory.
        force: replace an existing ``out_dir``.
        needed_bytes: what the build will write (for the free-space check and the disk-full message).
    """
    check_out_dir(out_dir, force=force)
    out_dir = out_dir.absolute()
    staging = old = None
    try:
        try:
            out_dir.parent.mkdir(parents=True, exist_ok=True)
            reclaim_stale(out_dir)
            check_free_space(out_dir, needed_bytes)
            staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.{owner_tag()}.", suffix=".partial",
                                            dir=out_dir.parent))
        except DiskFullError:
            raise
        except OSError as exc:
            raise KitUsageError(f"--out {out_dir} cannot be created ({exc.strerror}); choose a writable "
                                "location.") from None
        umask = os.umask(0)
        os.umask(umask)
        staging.chmod(0o777 & ~umask)
        try:
            yield staging
        except OSError as exc:
            if exc.errno in FULL_ERRNOS:
                raise _disk_full(exc, staging, out_dir, needed_bytes) from None
            raise
        with INTERRUPTS.deferred():  # the commit: a signal before or during it leaves out_dir as it was
            INTERRUPTS.raise_if_received()
            refuse_if_served(out_dir)  # a serve may have started since the build did
            if out_dir.exists():
                old = out_dir.with_name(f".{out_dir.name}.{owner_tag()}.old")
                out_dir.rename(old)
            staging.rename(out_dir)
            if INTERRUPTS.pending is not None:  # arrived during the renames: undo them
                out_dir.rename(staging)
                if old is not None:
                    old.rename(out_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        with INTERRUPTS.deferred():
            if old is not None and old.exists():
                if out_dir.exists():
                    shutil.rmtree(old, ignore_errors=True)
                else:
                    old.rename(out_dir)
            if staging is not None and staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
