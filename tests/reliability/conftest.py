"""Fixtures of the reliability tests: a tiny built artifact, private copies of it, and a serve of one; a float32
build served for the session."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from reliability_helpers import MODEL, kit
from serving_helpers import serve


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


@pytest.fixture(scope="module")
def served(tiny_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A serve of a private copy of the tiny artifact, for one test module, with its ensemble loaded; its state
    (endpoints, pids)."""
    out = tmp_path_factory.mktemp("served") / "out"
    shutil.copytree(tiny_artifact, out)
    state = serve(out, "--ensemble")
    yield state
    kit("stop", str(out), timeout=60)


@pytest.fixture(scope="session")
def served32(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """``builtin:tiny-llama`` built in float32 for the cpu target (verify off, one instance per text model), served
    for the session; its state. For tests that compare what it answers with ``transformers``: none changes it."""
    out = tmp_path_factory.mktemp("f32") / "out"
    done = kit("build", MODEL, "--target", "cpu", "--dtype", "float32", "--no-verify", "--instances", "1",
               "--out", str(out), timeout=600)
    assert done.returncode == 0, done.stderr
    state = serve(out)
    yield state
    kit("stop", str(out), timeout=60)
