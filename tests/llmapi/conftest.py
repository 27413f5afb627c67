"""Fixtures of the llmapi tests: tiny llmapi builds shared by the session (one served by a real tritonserver), and
a fake ``trtllm-serve`` on PATH, which needs a GPU, that records how it was started."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_trtllm_serve import TrtllmServePath, trtllm_serve_path
from kit_server import TINY_BUILDS, Builds

from tests.integration.tritonserver import running_server
from trtllm_kit.cli import run
from trtllm_kit.serve.server.process import TritonProcess


@pytest.fixture
def fake_trtllm_serve(tmp_path: Path) -> TrtllmServePath:
    return trtllm_serve_path(tmp_path / "bin", with_fake=True)


@pytest.fixture
def without_trtllm_serve(tmp_path: Path) -> TrtllmServePath:
    return trtllm_serve_path(tmp_path / "bin", with_fake=False)


@pytest.fixture(scope="session")
def engine_stage_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``builtin:tiny-llama`` built for the llmapi target up to its engine stage (verify off): what trtllm-serve
    is started on. Every test that serves it stops its serve, which removes the run's state."""
    out = tmp_path_factory.mktemp("llmapi-engine-stage") / "out"
    assert run(["build", "builtin:tiny-llama", "--target", "llmapi", "--no-verify", "--until", "engine",
                "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="session")
def llmapi_server(kit_builds: Builds,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, TritonProcess]]:
    """``builtin:tiny-llama`` built for the llmapi target (verify off), its repository served by a real
    tritonserver; the build output and the server. Only for tests that send requests and read what the server
    reports: a test that changes a server (loads, unloads, kills) starts its own."""
    work = tmp_path_factory.mktemp("llmapi-server")
    out = kit_builds.copy(TINY_BUILDS["llmapi"], work / "out")
    with running_server(out / "repo", work) as process:
        yield out, process
