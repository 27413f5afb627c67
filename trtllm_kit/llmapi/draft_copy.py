"""The draft of draft-target (or the EAGLE3 heads) copied into the llmapi artifact (``draft/``), so that
``speculative_model_dir`` names a directory the artifact carries: its top-level files (config, weights, tokenizer),
symbolic links followed; hidden files and subdirectories stay behind."""

from __future__ import annotations

import shutil
from pathlib import Path

from trtllm_kit.errors import KitUsageError


def draft_files(source: Path) -> list[Path]:
    """The files of a draft directory the artifact takes, by name.

    Arguments:
        source: the draft's directory (``--draft-model``).
    """
    return sorted(p for p in source.iterdir() if p.is_file() and not p.name.startswith("."))


def copy_draft(source: Path, dest: Path) -> int:
    """Copy the draft's files into the new directory ``dest``; returns the bytes copied.

    Arguments:
        source: the draft's directory; dest: the directory to create (``OUT/draft`` while staged).
    """
    files = draft_files(source)
    if not any(p.name == "config.json" for p in files):
        raise KitUsageError(f"--draft-model {source} has no config.json; pass the draft model's directory.")
    dest.mkdir()
    for path in files:
        shutil.copy2(path, dest / path.name)
    return sum(path.stat().st_size for path in files)


def draft_fingerprints(source: Path) -> dict[str, list[int]]:
    """The draft's files as a build's cache key sees them (size and mtime by name): a changed draft is converted
    or copied again.

    Arguments:
        source: the draft's directory.
    """
    return {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in draft_files(source)}
