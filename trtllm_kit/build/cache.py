"""Stage cache: each stage is keyed by a hash of its inputs, the spec fields it reads and the tool versions.

A build into an existing artifact reuses every stage whose key is unchanged: its directories are
hard-linked (or copied) from the old artifact into the new staging directory, and its summary sections are
carried over from the old manifest. ``--force`` rebuilds everything. Input files are identified by their
sha256; the old manifest's digest is reused when a file's size and mtime have not changed, so a re-run
does not hash a large model again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtllm_kit.artifact import MANIFEST, Artifact, StageRecords
from trtllm_kit.build.artifact import sha256_file
from trtllm_kit.errors import KitError

STAGE_DIRS = {"checkpoint": ("checkpoint", "tokenizer", "calibration"), "engine": ("engines", "logs"),
              "repo": ("repo",)}
STAGE_RECORDS = {"checkpoint": ("checkpoint", "calibration", "verify"), "engine": ("engine",), "repo": ("repo",)}


@dataclass(frozen=True)
class Previous:
    """What an earlier build left in ``--out``: its artifact (None when there is none, or it cannot be read)."""

    out_dir: Path
    artifact: Artifact | None

    @classmethod
    def load(cls, out_dir: Path, *, force: bool) -> Previous:
        if force or not (out_dir / MANIFEST).is_file():
            return cls(out_dir, None)
        try:
            return cls(out_dir, Artifact.read(out_dir))
        except KitError:  # unreadable or another schema: nothing is reused
            return cls(out_dir, None)

    def key(self, stage: str) -> str | None:
        return self.artifact.cache.stages.get(stage) if self.artifact else None

    def can_reuse(self, stage: str, key: str) -> bool:
        """The old artifact built ``stage`` with the same key and still holds its directories intact."""
        if self.artifact is None or self.key(stage) != key:
            return False
        outputs = self.artifact.files
        for directory in STAGE_DIRS[stage]:
            for name in (n for n in outputs if n.startswith(f"{directory}/")):
                path = self.out_dir / name
                if not path.is_file() or (path.stat().st_size == 0 and outputs[name] != _EMPTY_SHA):
                    return False
        return True

    def reuse(self, stage: str, staging: Path, records: StageRecords) -> None:
        """Link the stage's directories into ``staging`` and carry its records over into ``records``."""
        assert self.artifact is not None, "can_reuse said yes"
        for directory in STAGE_DIRS[stage]:
            source = self.out_dir / directory
            if source.is_dir():
                shutil.copytree(source, staging / directory, copy_function=_link_or_copy)
        records.take(self.artifact.records, STAGE_RECORDS[stage])

    def outputs_of(self, stages: list[str]) -> dict[str, str]:
        """The recorded digests of the files of ``stages`` (reused as they are)."""
        dirs = tuple(f"{d}/" for stage in stages for d in STAGE_DIRS[stage])
        if not dirs or self.artifact is None:
            return {}
        return {k: v for k, v in self.artifact.files.items() if k.startswith(dirs)}

    def fingerprints(self) -> dict[str, list[int]]:
        return self.artifact.cache.fingerprints if self.artifact else {}

    def inputs(self) -> dict[str, str]:
        return self.artifact.inputs if self.artifact else {}


_EMPTY_SHA = hashlib.sha256(b"").hexdigest()


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
    old_prints, old_inputs = previous.fingerprints(), previous.inputs()
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
