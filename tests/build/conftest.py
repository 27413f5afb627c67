"""Fixtures installing the fakes of ``fakes.py``: trtllm-build on PATH and an H100 host."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from fakes import FAKE_TRTLLM_BUILD, FakeTrtllmBuild, h100_machine

from trtllm_kit.artifact.machine import Machine


@pytest.fixture
def fake_trtllm_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeTrtllmBuild:
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    script = bin_dir / "trtllm-build"
    script.write_text(FAKE_TRTLLM_BUILD.format(python=sys.executable))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_TRTLLM_ARGV", str(tmp_path / "trtllm-build.argv.jsonl"))
    monkeypatch.delenv("FAKE_TRTLLM_FAIL", raising=False)
    monkeypatch.delenv("FAKE_TRTLLM_RANKS", raising=False)
    return FakeTrtllmBuild(bin_dir, tmp_path / "trtllm-build.argv.jsonl", monkeypatch)


@pytest.fixture
def gpu_host(monkeypatch: pytest.MonkeyPatch) -> Machine:
    """Make the build see an H100 host (the one place a GPU is faked)."""
    machine = h100_machine()
    monkeypatch.setattr("trtllm_kit.build.pipeline.detect_machine", lambda: machine)
    monkeypatch.setattr("trtllm_kit.build.dry_run.detect_machine", lambda: machine)
    return machine
