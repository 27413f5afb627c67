"""Fixtures of the model-repository tests: a tiny checkpoint and the built-in tokenizer files."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtllm_kit.checkpoint.convert import convert_checkpoint
from trtllm_kit.models.builtin import builtin_dir


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ckpt") / "checkpoint"
    convert_checkpoint(builtin_dir("tiny-llama"), out)
    return out


@pytest.fixture(scope="session")
def tokenizer_files() -> list[Path]:
    return sorted(p for p in builtin_dir("tiny-llama").iterdir() if p.name.startswith(("tokenizer", "special")))
