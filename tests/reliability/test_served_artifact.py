"""Items 7, 13 and 14 against a real tritonserver: a served artifact stays byte-for-byte what was built (state,
logs and bytecode live elsewhere), a build into it is refused, ``bench`` names the flag of the gate that
failed, and the server runs the kit's interpreter even when another ``python3`` comes first on PATH."""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kit_server import KitServer
from reliability_helpers import MODEL, error_line, kit

from trtllm_kit.serve.server.state import read_state, run_dir

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


@pytest.fixture(scope="module")
def served(tiny_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The tiny artifact served in the background, with a ``python3`` first on PATH that cannot run a stub."""
    out = tmp_path_factory.mktemp("served") / "out"
    shutil.copytree(tiny_artifact, out)
    before = tree(out)
    decoy = tmp_path_factory.mktemp("decoy")
    (decoy / "python3").write_text("#!/bin/sh\necho 'not the kit interpreter' >&2\nexit 1\n")
    (decoy / "python3").chmod(stat.S_IRWXU)
    with pytest.MonkeyPatch.context() as env:  # the serve and all it starts inherit this PATH
        env.setenv("PATH", f"{decoy}{os.pathsep}{os.environ['PATH']}")
        server = KitServer(out).start()
    yield {"out": out, "before": before, "state": read_state(out), "grpc": server.grpc}
    kit("stop", str(out), timeout=60)


def test_serving_writes_nothing_into_the_artifact(served: dict[str, Any]) -> None:
    out = served["out"]
    assert kit("generate", "The capital of France is", "--url", served["grpc"], "--max-tokens", "4").returncode == 0
    assert tree(out) == served["before"]
    assert kit("artifact", "verify", str(out)).returncode == 0
    state_dir = run_dir(out)
    assert {"serve.pid", "state.json", "tritonserver.log", "serve.log", "target"} <= {p.name for p in
                                                                                  state_dir.iterdir()}
    assert (state_dir / "target").read_text().strip() == str(out.resolve())


def test_a_build_into_a_served_artifact_is_refused(served: dict[str, Any]) -> None:
    out, pid = served["out"], served["state"]["pid"]
    done = kit("build", MODEL, "--no-verify", "--instances", "1", "--force", "--out", str(out))
    assert done.returncode == 2
    assert error_line(done) == (f"--out {out} is being served by pid {pid}; stop it first (trtllm-kit stop {out}) "
                                "or build into another directory.")
    assert tree(out) == served["before"]
    assert read_state(out)["pid"] == pid


def test_bench_names_the_flag_of_a_failed_gate(served: dict[str, Any], tmp_path: Path) -> None:
    done = kit("bench", "--url", f"grpc://{served['grpc']}", "--concurrency", "2", "--requests", "4", "--isl", "8",
               "--osl", "4", "--warmup", "1", "--no-plots", "--max-client-lag", "0.0001", "--out", str(tmp_path))
    assert done.returncode == 1
    message = error_line(done)
    assert "is above --max-client-lag 0.0001 ms: the load generator is saturated and adds up to that much to every " \
           "TTFT and ITL it measures (on a small client machine raise --max-client-lag" in message


def test_stop_leaves_a_verifiable_artifact_without_bytecode(served: dict[str, Any]) -> None:
    out = served["out"]
    done = kit("stop", str(out), timeout=60)
    assert done.returncode == 0, done.stderr
    assert not list(out.rglob("__pycache__")) and not (out / ".serve").exists()
    assert tree(out) == served["before"]
    assert kit("artifact", "verify", str(out)).returncode == 0
    assert not (run_dir(out) / "serve.pid").exists()
