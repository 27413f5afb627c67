"""The disk-full sentence names the file of the output that could not be written, whatever wrote it."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from trtllm_kit.build.staging import _disk_full


def test_a_copy_that_fills_the_disk_names_its_destination_not_its_source(tmp_path: Path) -> None:
    source = tmp_path / "cache" / "tokenizer.json"
    source.parent.mkdir()
    source.write_text("{}")
    staging = tmp_path / ".out.1.partial"
    (staging / "tokenizer").mkdir(parents=True)
    shutil.copyfile(source, staging / "tokenizer" / "tokenizer.json")
    # shutil's own ENOSPC: the source in ``filename``, the destination in ``filename2``
    exc = OSError(errno.ENOSPC, "No space left on device", str(source), None,
                  str(staging / "tokenizer" / "tokenizer.json"))
    message = str(_disk_full(exc, staging, tmp_path / "out", 0))
    assert " while writing tokenizer/tokenizer.json (" in message, message


def test_a_write_names_its_file(tmp_path: Path) -> None:
    staging = tmp_path / ".out.1.partial"
    (staging / "checkpoint").mkdir(parents=True)
    (staging / "checkpoint" / "rank0.safetensors").write_bytes(b"0" * 10)
    exc = OSError(errno.ENOSPC, "No space left on device", str(staging / "checkpoint" / "rank0.safetensors"))
    message = str(_disk_full(exc, staging, tmp_path / "out", 0))
    assert " while writing checkpoint/rank0.safetensors (" in message, message
