"""Fixtures of the harness tests: one real tritonserver with the ``tensorrt_llm`` stand-in (20 ms to the first
token, then one token every 20 ms) and one OpenAI SSE stand-in with the same pace, shared by the session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "standin"))

from servers import FIRST_TOKEN_MS, TOKEN_MS, OpenAIStandin, TritonServer, write_repo


@pytest.fixture(scope="session")
def triton_server(tmp_path_factory: pytest.TempPathFactory) -> TritonServer:
    root = tmp_path_factory.mktemp("triton")
    server = TritonServer(write_repo(root, FIRST_TOKEN_MS, TOKEN_MS), root)
    with server:
        yield server


@pytest.fixture(scope="session")
def openai_server() -> OpenAIStandin:
    with OpenAIStandin(FIRST_TOKEN_MS, TOKEN_MS) as server:
        yield server


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "triton_server" in getattr(item, "fixturenames", ()) or "openai_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.integration)
