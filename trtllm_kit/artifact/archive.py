"""Artifact archives for CI, and ``artifact verify``: every file's sha256 against the manifest, plus whether
the engines can run on this machine.

An archive is a tar (``.tar``, or gzip-compressed ``.tar.gz``/``.tgz``) of the artifact directory's
contents, ``manifest.json`` first, members sorted, owners and times zeroed so the same artifact packs to
the same bytes. Verification streams an archive without extracting it.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from trtllm_kit.artifact import MANIFEST, Artifact
from trtllm_kit.artifact.files import sha256_file
from trtllm_kit.artifact.integrity import TamperedError, walk_files
from trtllm_kit.diskspace import FULL_ERRNOS, DiskFullError, human_size
from trtllm_kit.errors import KitError, KitUsageError

COMPRESSED = (".tar.gz", ".tgz")


def pack_archive(artifact_dir: Path, archive: Path) -> Path:
    """Write ``archive`` (atomically) from an artifact directory.

    Arguments:
        artifact_dir: a build's ``--out`` (holds ``manifest.json``).
        archive: ``*.tar``, ``*.tar.gz`` or ``*.tgz``.
    """
    name = archive.name.lower()
    if not name.endswith((".tar", *COMPRESSED)):
        raise KitUsageError(f"--archive {archive} must end in .tar, .tar.gz or .tgz.")
    Artifact.read(artifact_dir)
    files = sorted(walk_files(artifact_dir))  # refuses symlinks and special files
    archive.parent.mkdir(parents=True, exist_ok=True)
    needed = sum((artifact_dir / rel).stat().st_size for rel in (MANIFEST, *files))
    free = shutil.disk_usage(archive.parent).free
    if needed > free and not name.endswith(COMPRESSED):
        raise DiskFullError(f"--archive {archive} needs about {human_size(needed)} but the file system of "
                            f"{archive.parent} has {human_size(free)} free; free {human_size(needed - free)} or "
                            "choose another --archive path.")
    fd, tmp = tempfile.mkstemp(prefix=f".{archive.name}.", suffix=".partial", dir=archive.parent)
    try:
        with os.fdopen(fd, "wb", buffering=0) as raw:  # unbuffered: a full disk fails inside the write
            try:
                _write_tar(raw, artifact_dir, files, compressed=name.endswith(COMPRESSED))
            except OSError as exc:
                if exc.errno not in FULL_ERRNOS:
                    raise
                written = os.fstat(raw.fileno()).st_blocks * 512
                free = shutil.disk_usage(archive.parent).free + written  # once the partial archive is gone
                raise DiskFullError(f"no space left on the file system of {archive.parent} while writing --archive "
                                    f"{archive.name} ({human_size(written)} written): the artifact holds "
                                    f"{human_size(needed)} and {human_size(free)} is free; free space or choose "
                                    "another --archive path.") from None
        os.replace(tmp, archive)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return archive


def _write_tar(raw: IO[bytes], artifact_dir: Path, files: list[str], compressed: bool) -> None:
    """The archive's bytes into ``raw``: ``manifest.json`` first, then ``files``, owners and times zeroed."""
    opened = gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) if compressed else contextlib.nullcontext(raw)
    with opened as stream, tarfile.open(fileobj=stream, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in (MANIFEST, *files):
            info = tar.gettarinfo(str(artifact_dir / rel), arcname=rel)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            with (artifact_dir / rel).open("rb") as f:
                tar.addfile(info, f)


@dataclass
class VerifyReport:
    """The outcome of ``verify_artifact``."""

    source: str
    num_files: int = 0
    mismatched: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # why the engines cannot run here
    has_engines: bool = False

    @property
    def hashes_ok(self) -> bool:
        return not (self.mismatched or self.missing or self.unexpected)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "num_files": self.num_files, "hashes_ok": self.hashes_ok,
                "mismatched": self.mismatched, "missing": self.missing, "unexpected": self.unexpected,
                "has_engines": self.has_engines, "compatible": not self.problems, "problems": self.problems}


def verify_artifact(path: Path, serve_problems: Callable[[Artifact], list[str]]) -> VerifyReport:
    """Check every file of an artifact directory or archive against its manifest, and whether it can be served
    here.

    Arguments:
        path: an artifact directory or an archive made by ``--archive``.
        serve_problems: what keeps an artifact from being served on this machine (its target's
        ``serve_problems``).
    """
    if path.is_dir():
        artifact = Artifact.read(path)
        actual = {name: sha256_file(path / name) for name in sorted(walk_files(path))}
    elif path.is_file():
        values, actual = _read_archive(path)
        artifact = Artifact.from_dict(values, path, f"{path}:{MANIFEST}")
    else:
        raise KitUsageError(f"{path} does not exist; pass an artifact directory or an archive made by --archive.")
    expected = artifact.files
    report = VerifyReport(str(path), num_files=len(expected))
    report.mismatched = sorted(n for n in expected if n in actual and actual[n] != expected[n])
    report.missing = sorted(set(expected) - set(actual))
    report.unexpected = sorted(set(actual) - set(expected))
    report.has_engines = artifact.has_engines
    report.problems = serve_problems(artifact)
    return report


def _read_archive(path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    digests: dict[str, str] = {}
    manifest: dict[str, Any] | None = None
    seen: set[str] = set()
    try:
        with tarfile.open(path, mode="r:*") as tar:
            for member in tar:
                check_member(path, member, seen)
                f = tar.extractfile(member)
                assert f is not None
                if member.name == MANIFEST:
                    data = f.read()
                    manifest = json.loads(data)
                    continue
                digest = hashlib.sha256()
                while block := f.read(16 * 2**20):
                    digest.update(block)
                digests[member.name] = digest.hexdigest()
    except TamperedError:
        raise
    except (tarfile.TarError, EOFError, OSError, gzip.BadGzipFile) as exc:
        reason = str(exc).splitlines()[0].rstrip(":") if str(exc) else type(exc).__name__
        raise KitError(f"{path} is not a readable tar archive ({reason}); it is truncated or not made by "
                       "--archive.") from None
    except json.JSONDecodeError:
        raise KitError(f"{path}: its {MANIFEST} is not valid JSON; the archive is corrupt.") from None
    if manifest is None:
        raise KitUsageError(f"{path} holds no {MANIFEST}; it is not a trtllm-kit artifact archive.")
    return manifest, digests


def check_member(archive: Path, member: tarfile.TarInfo, seen: set[str]) -> None:
    """Refuse a member that ``--archive`` never writes and that could land outside the directory it is
    extracted into or replace another file: links, devices, directories, absolute or ``..`` names, duplicates.

    Arguments:
        archive: the archive (for the message).
        member: the member read.
        seen: names read so far (updated).
    """
    name = member.name
    kind = ("a symlink" if member.issym() else "a hard link" if member.islnk() else None if member.isfile()
            else "not a regular file")
    parts = Path(name).parts
    if kind is None and (name.startswith("/") or ".." in parts or not parts):
        kind = "an absolute path" if name.startswith("/") else "a path that leaves the artifact"
    if kind is None and name in seen:
        kind = "a second member of that name"
    if kind is not None:
        target = f" -> {member.linkname}" if member.issym() or member.islnk() else ""
        raise TamperedError(f"{archive} holds {name}{target}, {kind}; archives made by --archive hold only "
                            "regular files with relative names: the archive was crafted or corrupted, do not "
                            "extract it.")
    seen.add(name)


def verdict(report: VerifyReport, *, hashes_only: bool) -> str | None:
    """The one-sentence failure of a report, or None when it passes.

    Arguments:
        report: from ``verify_artifact``.
        hashes_only: ignore compatibility with this machine.
    """
    if not report.hashes_ok:
        parts = [f"{len(report.mismatched)} changed ({', '.join(report.mismatched[:3])})" if report.mismatched else "",
                 f"{len(report.missing)} missing ({', '.join(report.missing[:3])})" if report.missing else "",
                 f"{len(report.unexpected)} not in the manifest ({', '.join(report.unexpected[:3])})"
                 if report.unexpected else ""]
        return (f"{report.source} does not match its manifest: {'; '.join(p for p in parts if p)}; the artifact is "
                "corrupt or was modified: rebuild or fetch it again.")
    if report.problems and not hashes_only:
        return (f"{report.source} is intact but its engines cannot run here: {'; '.join(report.problems)}; "
                "rebuild on this machine or pass --hashes-only to check the files alone.")
    return None

