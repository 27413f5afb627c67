"""``trtllm-kit serve`` failures: one sentence, the right exit code, and nothing left running."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from kit_cli import KIT

from trtllm_kit.artifact import EngineBuild
from trtllm_kit.serve.server.launcher import free_endpoints
from trtllm_kit.serve.server.state import run_dir

pytestmark = pytest.mark.integration


def serve_argv(out: Path, *extra: str) -> list[str]:
    ep = free_endpoints()
    return [*KIT, "serve", str(out), "--http-port", str(ep.http_port), "--grpc-port", str(ep.grpc_port),
            "--metrics-port", str(ep.metrics_port), *extra]


def servers_of(repo: Path) -> list[psutil.Process]:
    """Every tritonserver or stub process that serves ``repo``."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if any(str(repo) in arg for arg in proc.info["cmdline"] or []):
            found.append(proc)
    return found


def test_corrupted_repository(tmp_path: Path, make_out: Callable[..., Path]) -> None:
    out = make_out(tmp_path / "out", config_text='name: "ensemble"\nbackend: "python"\nmax_batch_size: ${b}\n')
    proc = subprocess.run(serve_argv(out), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    first = proc.stderr.splitlines()[0]
    config = run_dir(out) / "repo" / "ensemble" / "config.pbtxt"  # tritonserver reads serve's copy of repo/
    assert first.startswith("Error: tritonserver exited with code 1 while starting: Poll failed for model directory "
                            f"'ensemble': failed to read text proto from {config} "
                            "(log ") and first.endswith("tritonserver.log); last lines:"), proc.stderr
    assert "failed to load all models" in proc.stderr
    assert not servers_of(run_dir(out) / "repo")


def test_manifest_from_another_trtllm(tmp_path: Path, make_out: Callable[..., Path]) -> None:
    out = make_out(tmp_path / "out", engine=EngineBuild(
        dir="engines", world_size=1, tp_size=1, pp_size=1, tensorrt_llm="1.2.1", tensorrt=None, cuda="12.8",
        driver="570.1", gpu="H100", compute_capability="9.0"))
    proc = subprocess.run(serve_argv(out), capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stderr) == (2, f"Error: {out} cannot be served here: the engines were built with "
                                                 "tensorrt_llm 1.2.1, this machine has none; the engines need 1 GPU(s) "
                                                 "of compute capability 9.0, none is visible; rebuild it on this "
                                                 f"machine (trtllm-kit build ... --out {out} --force) or serve it "
                                                 "where it was built.\n")


def test_port_in_use(fake_out: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        proc = subprocess.run(serve_argv(fake_out, "--openai-port", str(port)), capture_output=True, text=True,
                              timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"Error: OpenAI port {port} on 127.0.0.1 is in use by pid {os.getpid()} ")
    assert not servers_of(run_dir(fake_out) / "repo")


def test_generate_without_a_server() -> None:
    port = free_endpoints().grpc_port
    proc = subprocess.run([*KIT, "generate", "hi", "--url", f"127.0.0.1:{port}"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"Error: no server answers at 127.0.0.1:{port}: ")
    assert proc.stderr.endswith("; start one with trtllm-kit serve OUT or pass --url.\n")
