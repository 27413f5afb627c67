"""Fixtures of the reliability tests: a tiny built artifact and private copies of it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from reliability_helpers import MODEL, kit


@pytest.fixture(scope="session")
def tiny_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``builtin:tiny-llama`` built with verify off and one instance per text model (the model is generated on
    first use)."""
    out = tmp_path_factory.mktemp("tiny") / "out"
    done = kit("build", MODEL, "--no-verify", "--instances", "1", "--out", str(out))
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture
def artifact_copy(tiny_artifact: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny artifact (times preserved, so it still matches its manifest's records)."""
    out = tmp_path / "out"
    shutil.copytree(tiny_artifact, out)
    return out
