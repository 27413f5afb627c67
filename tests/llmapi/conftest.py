"""Fixtures of the llmapi tests: one llmapi build of the tiny Llama on a real tritonserver, shared by the session."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from trtllm_kit.cli import run
from trtllm_kit.serve.server.process import TritonProcess

sys.path.insert(0, str(Path(__file__).parents[1] / "integration"))
from tritonserver import running_server


@pytest.fixture(scope="session")
def llmapi_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, TritonProcess]]:
    """``builtin:tiny-llama`` built for the llmapi target (verify off), its repository served by a real
    tritonserver; the build output and the server. Only for tests that send requests and read what the server
    reports: a test that changes a server (loads, unloads, kills) starts its own."""
    work = tmp_path_factory.mktemp("llmapi-server")
    out = work / "out"
    assert run(["build", "builtin:tiny-llama", "--target", "llmapi", "--no-verify", "--out", str(out)]) == 0
    with running_server(out / "repo", work) as process:
        yield out, process
