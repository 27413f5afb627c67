"""Test isolation: the kit's cache and the HF cache point into a per-session temporary directory."""

from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def isolated_caches(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built-in models are generated once per session under a temporary cache; nothing touches ~/.cache."""
    root = tmp_path_factory.mktemp("caches")
    saved = {k: os.environ.get(k) for k in ("TRTLLM_KIT_CACHE", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE")}
    os.environ["TRTLLM_KIT_CACHE"] = str(root / "trtllm-kit")
    os.environ["HF_HOME"] = str(root / "hf")
    os.environ.pop("HF_HUB_CACHE", None)
    os.environ["HF_HUB_OFFLINE"] = "1"
    yield root
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def pytest_unconfigure(config: pytest.Config) -> None:
    """The summary line is the run's last: OpenAI Triton's compiler module (torch._dynamo imports it where xgrammar
    installed it) lists its live objects on stderr when the interpreter ends, after pytest has given its stderr
    back; an exit function, which runs after that, sends what remains to /dev/null."""
    atexit.register(_quiet_end)


def _quiet_end() -> None:
    if "triton._C.libtriton" in sys.modules:
        sys.stdout.flush()
        sys.stderr.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
