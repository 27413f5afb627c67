"""Whether an artifact directory still holds exactly the files its manifest lists.

The manifest records every output's sha256 (``outputs``) and, since this check exists, its size and
modification time in nanoseconds (``output_stats``: name → ``[size, mtime_ns]``). ``check_artifact`` compares
sizes always; a file whose time differs from the record (a copy, an extraction, an edit) is hashed and must
match its sha256; with ``hashes=True`` every file is hashed. Any file not in the manifest, any symlink and
any special file is refused: Triton would load a model directory added to ``repo/`` as readily as the kit's.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from trtllm_kit.artifact import MANIFEST, Artifact
from trtllm_kit.artifact.files import sha256_file
from trtllm_kit.errors import KitError


class TamperedError(KitError):
    """An artifact's files differ from its manifest."""


def walk_files(root: Path) -> dict[str, os.stat_result]:
    """Every regular file under ``root`` (keyed by its path relative to it, ``manifest.json`` excluded), without
    following symlinks; a symlink or special file raises ``TamperedError``.

    Arguments:
        root: an artifact directory.
    """
    found: dict[str, os.stat_result] = {}
    for directory, dirs, files in os.walk(root, followlinks=False):
        for name in sorted(dirs + files):
            path = Path(directory) / name
            info = path.lstat()
            rel = str(path.relative_to(root))
            if stat.S_ISLNK(info.st_mode):
                raise TamperedError(f"{root} holds a symlink, {rel} -> {os.readlink(path)}; an artifact holds "
                                    "only regular files: rebuild it or fetch it again.")
            if stat.S_ISREG(info.st_mode):
                if rel != MANIFEST:
                    found[rel] = info
            elif not stat.S_ISDIR(info.st_mode):
                raise TamperedError(f"{root} holds {rel}, which is not a regular file; an artifact holds only "
                                    "regular files: rebuild it or fetch it again.")
    return found


def file_stats(root: Path) -> dict[str, list[int]]:
    """``[size, mtime_ns]`` of every file under ``root`` (what ``manifest.json``'s ``output_stats`` holds).

    Arguments:
        root: the staging directory of a build, before ``manifest.json`` is written.
    """
    return {name: [info.st_size, info.st_mtime_ns] for name, info in sorted(walk_files(root).items())}


def artifact_changes(artifact: Artifact, *, hashes: bool = False) -> list[str]:
    """What differs between the artifact's directory and its manifest, one phrase per file (empty when nothing does).

    Arguments:
        artifact: the artifact as read from its directory.
        hashes: hash every file, not only those whose size or time differ from the record.
    """
    out, expected, stats = artifact.path, artifact.files, artifact.file_stats
    actual = walk_files(out)
    changes = [f"{name} is missing" for name in sorted(set(expected) - set(actual))]
    changes += [f"{name} is not in the manifest" for name in sorted(set(actual) - set(expected))]
    for name in sorted(set(expected) & set(actual)):
        info, record = actual[name], stats.get(name)
        if record is not None and info.st_size != record[0]:
            changes.append(f"{name} changed (size {record[0]} → {info.st_size} bytes)")
        elif _must_hash(hashes, record, info, bool(stats)) and sha256_file(out / name) != expected[name]:
            changes.append(f"{name} changed (its sha256 differs from the manifest)")
    return changes


def _must_hash(hashes: bool, record: list[int] | None, info: os.stat_result, has_stats: bool) -> bool:
    """Hash when asked, when the manifest predates ``output_stats``, or when the file's time moved."""
    if hashes or not has_stats:
        return True
    return record is not None and info.st_mtime_ns != record[1]


def check_artifact(artifact: Artifact, *, hashes: bool = False) -> None:
    """Raise ``TamperedError`` naming the first files that differ from the manifest.

    Arguments:
        artifact: the artifact as read from its directory.
        hashes: hash every file (``serve --verify``), not only those whose size or time differ.
    """
    out = artifact.path
    changes = artifact_changes(artifact, hashes=hashes)
    if changes:
        more = f" and {len(changes) - 3} more" if len(changes) > 3 else ""
        raise TamperedError(f"{out} does not match its manifest: {'; '.join(changes[:3])}{more}; the artifact was "
                            f"modified after it was built: rebuild it (trtllm-kit build ... --out {out}) or fetch "
                            "it again.")
