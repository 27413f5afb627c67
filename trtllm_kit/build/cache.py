"""Stage cache: each stage is keyed by a hash of its inputs, the spec fields it reads and the tool versions.

A build into an existing artifact reuses every stage whose key is unchanged and whose files all still have
the sha256 the old manifest records: its directories are hard-linked (or copied) from the old artifact into
the new staging directory, and its stage records are carried over from the old artifact. ``--force``
rebuilds everything. Input files are identified by their sha256; the old manifest's digest is reused when a
file's size and mtime have not changed, so a re-run does not hash a large model again. ``trtllm-kit build`` begins
the hashing in a child process (``BackgroundDigests``) before it loads torch, which takes a second on one core.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtllm_kit.artifact import MANIFEST, Artifact, StageRecords
from trtllm_kit.artifact.files import sha256_file, sha256_files
from trtllm_kit.errors import KitError
from trtllm_kit.names import DRAFT_CHECKPOINT_DIR, DRAFT_DIR, DRAFT_ENGINE_DIR

STAGE_DIRS = {"checkpoint": ("checkpoint", "tokenizer", "calibration", DRAFT_DIR),
              "engine": ("engines", "logs", DRAFT_CHECKPOINT_DIR, DRAFT_ENGINE_DIR), "repo": ("repo",)}
STAGE_RECORDS = {"checkpoint": ("checkpoint", "calibration", "verify", "draft"), "engine": ("engine",),
                 "repo": ("repo",)}


@dataclass(frozen=True)
class Previous:
    """What an earlier build left in ``--out``: its artifact (None when there is none, or it cannot be read)."""

    out_dir: Path
    artifact: Artifact | None
    checked: dict[str, str | None] = field(default_factory=dict, compare=False)  # stage → damage, hashed once

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
        outputs = self.artifact.files if self.artifact else {}
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


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def fingerprint(path: Path) -> list[int]:
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns]


Known = dict[str, tuple[list[int], str]]  # file name -> (its size and mtime when hashed, its sha256)


def input_digests(paths: list[Path], previous: Previous, known: Known | None = None) -> dict[str, str]:
    """sha256 of each input file, reusing a digest taken before (the old manifest's, or ``known``) when the file's
    size and mtime are still those it had then.

    Arguments:
        paths: the model's config and weight files.
        previous: the old artifact.
        known: digests taken earlier in this run (``BackgroundDigests``).
    """
    old_inputs = previous.inputs()
    before: Known = {name: (prints, old_inputs[name]) for name, prints in previous.fingerprints().items()
                     if name in old_inputs}
    before.update(known or {})
    digests = {path.name: before[path.name][1] for path in paths
               if path.name in before and before[path.name][0] == fingerprint(path)}
    fresh = [path for path in paths if path.name not in digests]
    digests.update(zip((path.name for path in fresh), sha256_files(fresh), strict=True))
    return {path.name: digests[path.name] for path in paths}


def _fingerprint_or_none(path: Path) -> list[int] | None:
    try:
        return fingerprint(path)
    except OSError:
        return None


def likely_inputs(model: str, calib_data: str | None) -> list[Path]:
    """The files a build of ``model`` will hash, as far as a look at the directory tells (its config.json and
    safetensors files, the calibration text; a GGUF file itself); a builtin or hub name gives none here.

    Arguments:
        model: the build's model argument; calib_data: ``--calib-data`` or None.
    """
    directory = Path(model)
    found = [directory / "config.json", *sorted(directory.glob("*.safetensors"))] if directory.is_dir() else \
        [directory] if directory.suffix.lower() == ".gguf" else []
    return [path for path in [*found, *([Path(calib_data)] if calib_data else [])] if path.is_file()]


class BackgroundDigests:
    """The sha256 of ``paths`` taken by a child process (``hash_child.py``) while the build loads its libraries,
    for ``input_digests`` to reuse; ``result`` waits for it. Best effort: a file it could not read (or a child that
    could not start) is left to ``input_digests``, which says why. Leaving the ``with`` block, however it is left,
    ends the child.

    Arguments:
        paths: the files; previous: the old artifact (files it already has digests for are not hashed).
    """

    def __init__(self, paths: list[Path], previous: Previous) -> None:
        old = previous.fingerprints()
        todo = [str(path) for path in paths if old.get(path.name) != _fingerprint_or_none(path)]
        self._child: subprocess.Popen[str] | None = None
        if todo:
            with contextlib.suppress(OSError):  # no child: input_digests hashes them itself
                argv = [sys.executable, "-m", "trtllm_kit.build.hash_child", str(os.getpid()), *todo]
                self._child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def __enter__(self) -> BackgroundDigests:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._child is None:
            return
        if self._child.poll() is None:
            self._child.kill()
        self._child.wait()
        assert self._child.stdout is not None, "started with a pipe"
        self._child.stdout.close()

    def result(self) -> Known:
        if self._child is None:
            return {}
        assert self._child.stdout is not None, "started with a pipe"
        lines = [json.loads(line) for line in self._child.stdout if line.startswith("{")]
        self._child.wait()
        return {line["name"]: (line["fingerprint"], line["sha256"]) for line in lines}


def stage_key(stage: str, parts: dict[str, Any]) -> str:
    """A stable hash of what decides a stage's output.

    Arguments:
        stage: the stage name.
        parts: JSON-serialisable inputs (digests, spec fields, tool versions, the previous stage's key).
    """
    body = json.dumps({"stage": stage, **parts}, sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()[:32]
