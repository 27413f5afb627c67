"""Stage cache: each stage is keyed by a hash of its inputs, the spec fields it reads and the tool versions.

A build into an existing artifact reuses every stage whose key is unchanged and whose files all still have
the sha256 the old manifest records: its directories are hard-linked (or copied) from the old artifact into
the new staging directory, and its summary sections are carried over from the old manifest. ``--force``
rebuilds everything. Input files are identified by their sha256; the old manifest's digest is reused when a
file's size and mtime have not changed, so a re-run does not hash a large model again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtllm_kit.build.artifact import MANIFEST, SCHEMA_VERSION, sha256_file

STAGE_DIRS = {"checkpoint": ("checkpoint", "tokenizer", "calibration"), "engine": ("engines", "logs"),
              "repo": ("repo",)}
STAGE_SUMMARY = {"checkpoint": ("checkpoint", "calibration", "verify"), "engine": ("engine",), "repo": ("repo",)}


@dataclass(frozen=True)
class Previous:
    """What an earlier build left in ``--out``: its manifest (empty when there is none or it is unreadable)."""

    out_dir: Path
    manifest: dict[str, Any]
    checked: dict[str, str | None] = field(default_factory=dict, compare=False)  # stage → damage, hashed once

    @classmethod
    def load(cls, out_dir: Path, *, force: bool) -> Previous:
        path = out_dir / MANIFEST
        manifest: dict[str, Any] = {}
        if not force and path.is_file():
            try:
                manifest = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                manifest = {}
            if manifest.get("schema_version") != SCHEMA_VERSION:
                manifest = {}
        return cls(out_dir, manifest)

    def key(self, stage: str) -> str | None:
        return ((self.manifest.get("cache") or {}).get("stages") or {}).get(stage)

    def can_reuse(self, stage: str, key: str) -> bool:
        """The old artifact built ``stage`` with the same key and still holds its files exactly as built."""
        return self.key(stage) == key and self.damage(stage) is None

    def damage(self, stage: str) -> str | None:
        """What is wrong with the old artifact's files of ``stage`` (first file named), or None when every file
        the manifest lists is there, a regular file, with the recorded sha256 (each is hashed: a flipped byte
        keeps a file's size and may keep its time)."""
        if stage not in self.checked:
            self.checked[stage] = self._damage(stage)
        return self.checked[stage]

    def _damage(self, stage: str) -> str | None:
        outputs = self.manifest.get("outputs") or {}
        names = [n for n in sorted(outputs) if n.startswith(tuple(f"{d}/" for d in STAGE_DIRS[stage]))]
        for name in names:
            path = self.out_dir / name
            if path.is_symlink() or not path.is_file():
                return f"{name} of the previous build is missing or not a regular file"
            if sha256_file(path) != outputs[name]:
                return f"{name} of the previous build differs from its manifest (sha256)"
        for directory in STAGE_DIRS[stage]:
            root = self.out_dir / directory
            extra = sorted(str(p.relative_to(self.out_dir)) for p in root.rglob("*")
                           if not p.is_dir() and str(p.relative_to(self.out_dir)) not in outputs) \
                if root.is_dir() else []
            if extra:
                return f"{extra[0]} in the previous build is not in its manifest"
        return None

    def reuse(self, stage: str, staging: Path) -> dict[str, Any]:
        """Link the stage's directories into ``staging``; return the summary sections it had."""
        for directory in STAGE_DIRS[stage]:
            source = self.out_dir / directory
            if source.is_dir():
                shutil.copytree(source, staging / directory, copy_function=_link_or_copy)
        summary = self.manifest.get("summary") or {}
        return {k: summary[k] for k in STAGE_SUMMARY[stage] if k in summary}

    def outputs_of(self, stages: list[str]) -> dict[str, str]:
        """The recorded digests of the files of ``stages`` (reused as they are)."""
        dirs = tuple(f"{d}/" for stage in stages for d in STAGE_DIRS[stage])
        return {k: v for k, v in (self.manifest.get("outputs") or {}).items() if k.startswith(dirs)} if dirs else {}

    def fingerprints(self) -> dict[str, list[int]]:
        return (self.manifest.get("cache") or {}).get("fingerprints") or {}



def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def fingerprint(path: Path) -> list[int]:
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns]


def input_digests(paths: list[Path], previous: Previous) -> dict[str, str]:
    """sha256 of each input file, reusing the old manifest's digest when size and mtime match.

    Arguments:
        paths: the model's config and weight files.
        previous: the old artifact.
    """
    old_prints, old_inputs = previous.fingerprints(), previous.manifest.get("inputs") or {}
    digests = {}
    for path in paths:
        if old_prints.get(path.name) == fingerprint(path) and path.name in old_inputs:
            digests[path.name] = old_inputs[path.name]
        else:
            digests[path.name] = sha256_file(path)
    return digests


def stage_key(stage: str, parts: dict[str, Any]) -> str:
    """A stable hash of what decides a stage's output.

    Arguments:
        stage: the stage name.
        parts: JSON-serialisable inputs (digests, spec fields, tool versions, the previous stage's key).
    """
    body = json.dumps({"stage": stage, **parts}, sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()[:32]
