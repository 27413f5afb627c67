"""A real two-rank launch under OpenMPI's ``mpirun`` (Debian's ``openmpi-bin``): rank 0 serves, rank 1 loads its
model explicitly and opens no endpoint; SIGTERM ends both ranks and their stubs and removes both shm prefixes."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import psutil
import pytest
from polling import wait_until

from trtllm_kit.serve.server.launcher import LaunchConfig, free_endpoints
from trtllm_kit.serve.server.locate import locate_tritonserver
from trtllm_kit.serve.server.process import TritonProcess, group_alive

pytestmark = [pytest.mark.integration, pytest.mark.skipif(shutil.which("mpirun") is None,
                                                         reason="mpirun not installed (apt install openmpi-bin)")]


def test_two_ranks(fake_out: Path, tmp_path: Path) -> None:
    config = LaunchConfig(repo=fake_out / "repo", endpoints=free_endpoints(), world_size=2,
                          trtllm_models=("ensemble",), shm_prefix=f"trtllmkit_{os.getpid()}_")
    process = TritonProcess(locate_tritonserver(), config, tmp_path / "ranks.log")
    process.start()
    try:
        process.wait_ready(60)
        tree = psutil.Process(process.pid).children(recursive=True)
        servers = [p for p in tree if p.name() == "tritonserver"]
        assert len(servers) == 2
        assert sum("--allow-http=false" in p.cmdline() for p in servers) == 1  # rank 1 opens no endpoint

        def regions() -> list[str]:
            return sorted(p.name[len(config.shm_prefix):][:2] for p in Path("/dev/shm").glob(f"{config.shm_prefix}*"))

        # one stub per rank, each under its own prefix; readiness is rank 0's, and rank 1's stub may start after it
        assert wait_until(lambda: regions() == ["0_", "1_"], 60, 0.05), regions()
    finally:
        process.stop()
    assert not group_alive(process.pid)
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not list(Path("/dev/shm").glob(f"{config.shm_prefix}*"))
