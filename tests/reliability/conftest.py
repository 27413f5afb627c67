"""Fixtures of the reliability tests: a tiny built artifact and private copies of it, the session's shared serve of
the tiny build, and a float32 build served for the session."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kit_server import STOP_TIMEOUT_S, TINY_BUILDS, BuildKey, Builds, Servers
from serving_helpers import wait_idle

from trtllm_kit.serve.server.detach import stop_serving


@pytest.fixture(scope="session")
def tiny_artifact(kit_builds: Builds, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the session's build of ``builtin:tiny-llama`` (verify off, one instance per text model), which is
    served elsewhere; its tests may change this one."""
    return kit_builds.copy(TINY_BUILDS["cpu"], tmp_path_factory.mktemp("tiny") / "out")


@pytest.fixture
def artifact_copy(tiny_artifact: Path, tmp_path: Path) -> Iterator[Path]:
    """A private copy of the tiny artifact (times preserved, so it still matches its manifest's records); a serve of
    it that the test left running (it failed before it ended it) is stopped after the test."""
    out = tmp_path / "out"
    shutil.copytree(tiny_artifact, out)
    yield out
    stop_serving(out, STOP_TIMEOUT_S)


@pytest.fixture(scope="module")
def served(kit_servers: Servers) -> dict[str, Any]:
    """The session's shared serve of the tiny build with its ensemble loaded, idle when a module starts; its state
    (endpoints, pids) and output. Its modules only send requests, each read to its end or dropped."""
    server = kit_servers.get(TINY_BUILDS["cpu"], ensemble=True)
    state = {**server.state, "out": server.out}
    assert wait_idle(state, 60)[1]["active"] == 0  # what an earlier module sent has ended
    return state


@pytest.fixture(scope="session")
def served32(kit_servers: Servers) -> dict[str, Any]:
    """``builtin:tiny-llama`` built in float32 for the cpu target (verify off, one instance per text model), served
    for the session; its state. For tests that compare what it answers with ``transformers``: none changes it."""
    server = kit_servers.get(BuildKey.of(target="cpu", dtype="float32"))
    return {**server.state, "out": server.out}
