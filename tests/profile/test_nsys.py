"""Nsight Systems: the exact argv (a fake ``nsys`` on PATH records it), ``nsys stats`` CSV parsing from sample
files, the missing-nsys sentence, and one `trtllm-kit profile` run of a real tritonserver under the fake."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from servers import TritonServer, write_repo

from trtllm_kit.cli import run
from trtllm_kit.errors import KitError, KitUsageError
from trtllm_kit.profile.nsys import (
    capture_in_measurement,
    find_nsys,
    kernel_categories,
    parse_iterations,
    profile_argv,
    read_summary_csv,
    stats_argv,
)

DATA = Path(__file__).parent / "data"


@pytest.fixture
def fake_nsys(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shutil.copy(Path(__file__).parent / "fake_nsys.py", bin_dir / "nsys")
    (bin_dir / "nsys").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_NSYS_LOG", str(tmp_path / "nsys.log"))
    monkeypatch.setenv("FAKE_NSYS_CSV_DIR", str(DATA))
    return tmp_path / "nsys.log"


def test_argv_contract():
    assert profile_argv("nsys", Path("/o/profile"), ["tritonserver", "--model-repository=/r"]) == [
        "nsys", "profile", "-o", "/o/profile", "-f", "true", "-t", "cuda,nvtx,osrt", "--cuda-graph-trace=node",
        "-c", "cudaProfilerApi", "--capture-range-end=stop", "--trace-fork-before-exec=true",
        "tritonserver", "--model-repository=/r"]
    assert stats_argv("nsys", Path("/o/profile.nsys-rep"), Path("/o/stats")) == [
        "nsys", "stats", "--report", "cuda_gpu_kern_sum,cuda_api_sum,nvtx_sum,cuda_gpu_mem_time_sum", "--format",
        "csv", "--timeunit", "ms", "--force-export=true", "--output", "/o/stats", "/o/profile.nsys-rep"]
    assert parse_iterations("100-150") == (100, 150)
    with pytest.raises(KitUsageError, match="START < STOP"):
        parse_iterations("150-100")


def test_stats_csv_parsing_and_kernel_categories():
    kernels = read_summary_csv(DATA / "stats_cuda_gpu_kern_sum.csv", top=100)
    assert [k["total_ms"] for k in kernels[:2]] == [830.25, 440.1]
    assert kernels[0]["instances"] == 12800 and kernels[0]["name"].startswith("sm90_xmma_gemm")
    assert kernel_categories(kernels) == {"gemm": 830.25, "attention": 440.1 + 160.0, "all_reduce": 250.0,
                                          "sampling": 180.0, "other": 139.65}
    ranges = read_summary_csv(DATA / "stats_nvtx_sum.csv", top=2)
    assert [r["name"] for r in ranges] == ["trtllm-kit:measure/concurrency=8/repeat/0",
                                           "trtllm-kit:warmup/concurrency=8"]


def test_capture_window_is_checked_against_the_measured_iterations():
    runs = [{"server_metrics": {"iteration_counter": [40, 90]}}, {"server_metrics": {"iteration_counter": [95, 400]}}]
    assert capture_in_measurement(runs, (100, 150)) is True
    assert capture_in_measurement(runs, (80, 120)) is False  # straddles warm-up and measurement
    assert capture_in_measurement([{"server_metrics": None}], (100, 150)) is None


def test_missing_nsys_is_one_clear_sentence(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(KitError, match=r"^nsys \(Nsight Systems\) is not on PATH; install"):
        find_nsys()


@pytest.mark.integration
def test_profile_runs_the_server_under_nsys(fake_nsys, tmp_path, monkeypatch, capsys):
    server = TritonServer(write_repo(tmp_path / "srv", 5, 5), tmp_path)
    for key in ("LD_LIBRARY_PATH",):
        monkeypatch.setenv(key, server.env()[key])
    monkeypatch.setenv("PATH", f"{os.environ['PATH']}:{server.env()['PATH']}")
    out = tmp_path / "prof"
    code = run(["profile", "--url", server.grpc_url, "--metrics-url", server.metrics_url, "--concurrency", "2",
                "--requests", "6", "--isl", "8", "--osl", "4", "--warmup", "2", "--iterations", "20-40",
                "--ready-url", f"http://127.0.0.1:{server.http_port}/v2/health/ready", "--no-plots",
                "--max-client-lag", "1000", "--out", str(out), "--", *server.argv()])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    calls = [json.loads(line) for line in fake_nsys.read_text().splitlines()]
    assert calls[0]["argv"] == profile_argv("nsys", out / "profile", server.argv())[1:]
    assert calls[0]["TLLM_PROFILE_START_STOP"] == "20-40"
    assert calls[1]["argv"][:2] == ["stats", "--report"]
    summary = json.loads((out / "profile_summary.json").read_text())
    assert summary["top_kernels"][0]["total_ms"] == 830.25 and summary["bench_valid"]
    assert summary["capture_in_measurement"] is None  # the stand-in has no iteration counter
    assert summary["top_nvtx_ranges"][0]["name"].startswith("trtllm-kit:measure")
    assert (out / "summary.json").is_file() and "sm90_xmma_gemm" in printed.out
