"""Fixtures of the deploy tests: artifacts written as a GPU build writes them (``deploy_artifacts.py``), and the
module's copy of the tiny build that ``deploy try`` runs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from deploy_artifacts import write_artifact
from deploy_helpers import tiny_copy
from kit_server import Builds


@pytest.fixture(scope="module")
def tiny(kit_builds: Builds, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``builtin:tiny-llama`` for the cpu target, the module's copy of the session's build."""
    return tiny_copy(kit_builds, tmp_path_factory.mktemp("tiny"), "cpu")


@pytest.fixture
def artifact(tmp_path: Path) -> Callable[..., Path]:
    """``write_artifact`` into a fresh directory."""
    counter = iter(range(100))
    return lambda **kwargs: write_artifact(tmp_path / f"artifact{next(counter)}", **kwargs)
