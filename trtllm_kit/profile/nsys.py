"""Nsight Systems: the server under ``nsys profile`` with an iteration capture range, harness NVTX ranges,
and ``nsys stats`` CSVs reduced to the top kernels and NVTX ranges (``docs/harness.md`` §7)."""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from trtllm_kit.errors import KitError, KitUsageError
from trtllm_kit.http_probe import answers
from trtllm_kit.profile.bench import run_bench_async
from trtllm_kit.serve.server.group import ProcessGroup, kit_environment

STATS_REPORTS = ("cuda_gpu_kern_sum", "cuda_api_sum", "nvtx_sum", "cuda_gpu_mem_time_sum")
KERNEL_CATEGORIES = (("all_reduce", r"nccl|allreduce|all_reduce"), ("attention", r"mmha|fmha|attention|xqa|flash"),
                     ("gemm", r"gemm|cutlass|cublas|sm\d+_xmma|ampere_|hopper_|matmul"),
                     ("sampling", r"top_?k|sampl|softmax|argmax"), ("memcpy", r"memcpy|memset|copy"))


def find_nsys() -> str:
    """The ``nsys`` executable on PATH, or a KitError that says what to install."""
    path = shutil.which("nsys")
    if path is None:
        raise KitError("nsys (Nsight Systems) is not on PATH; install Nsight Systems or the CUDA toolkit and add "
                       "its bin directory to PATH, or measure without a trace with `trtllm-kit bench`.")
    return path


def parse_iterations(text: str) -> tuple[int, int]:
    """``"100-150"`` → ``(100, 150)``.

    Arguments:
        text: the TLLM_PROFILE_START_STOP window.
    """
    match = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", text)
    if not match or int(match[1]) >= int(match[2]):
        raise KitUsageError(f"--iterations {text!r} is not START-STOP with START < STOP; "
                            "example: --iterations 100-150.")
    return int(match[1]), int(match[2])


def profile_argv(nsys: str, output: Path, server_argv: list[str]) -> list[str]:
    """The ``nsys profile`` command around the server: capture only between cudaProfilerStart/Stop.

    Arguments:
        nsys: the nsys executable.
        output: report path without the ``.nsys-rep`` suffix.
        server_argv: the server command.
    """
    return [nsys, "profile", "-o", str(output), "-f", "true", "-t", "cuda,nvtx,osrt", "--cuda-graph-trace=node",
            "-c", "cudaProfilerApi", "--capture-range-end=stop", "--trace-fork-before-exec=true", *server_argv]


def profile_env(iterations: tuple[int, int]) -> dict[str, str]:
    """Environment for the server: the executor calls cudaProfilerStart/Stop at these iterations.

    Arguments:
        iterations: (start, stop) engine iterations.
    """
    return {"TLLM_PROFILE_START_STOP": f"{iterations[0]}-{iterations[1]}"}


def stats_argv(nsys: str, report: Path, prefix: Path) -> list[str]:
    """``nsys stats`` writing one CSV per report as ``<prefix>_<report>.csv``.

    Arguments:
        nsys: the nsys executable.
        report: the ``.nsys-rep`` file.
        prefix: output prefix.
    """
    return [nsys, "stats", "--report", ",".join(STATS_REPORTS), "--format", "csv", "--timeunit", "ms",
            "--force-export=true", "--output", str(prefix), str(report)]


def run_stats(nsys: str, report: Path, prefix: Path) -> dict[str, Path]:
    """Run ``nsys stats``; returns the CSV files that exist, by report name.

    Arguments:
        nsys: the nsys executable.
        report: the ``.nsys-rep`` file.
        prefix: output prefix.
    """
    proc = subprocess.run(stats_argv(nsys, report, prefix), capture_output=True, text=True)
    if proc.returncode != 0:
        raise KitError(f"nsys stats failed with exit code {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return {name: p for name in STATS_REPORTS if (p := Path(f"{prefix}_{name}.csv")).is_file()}


def _number(text: str) -> float:
    return float(text.replace(",", "")) if text.strip() else 0.0


def read_summary_csv(path: Path, top: int = 10) -> list[dict[str, Any]]:
    """The ``top`` rows of a ``*_sum`` CSV by total time: name, total_ms, instances, avg_ms, percent.

    Arguments:
        path: a ``cuda_gpu_kern_sum`` / ``nvtx_sum`` / ``cuda_api_sum`` CSV.
        top: number of rows.
    """
    with path.open(newline="") as f:
        rows = list(csv.DictReader(line for line in f if line.strip() and not line.startswith("NOTICE")))
    if not rows:
        return []
    columns = list(rows[0])
    total_col = next(c for c in columns if c.startswith("Total Time"))
    avg_col = next((c for c in columns if c.startswith("Avg")), None)
    name_col = next(c for c in ("Name", "Range", "Operation") if c in columns)
    scale = 1e-6 if "(ns)" in total_col else 1e-3 if "(us)" in total_col else 1.0
    out: list[dict[str, Any]] = [{"name": row[name_col], "total_ms": _number(row[total_col]) * scale,
            "instances": int(_number(row.get("Instances", "0") or "0")),
            "avg_ms": _number(row[avg_col]) * scale if avg_col else None,
            "percent": _number(row.get("Time (%)", "0") or "0")} for row in rows]
    return sorted(out, key=lambda r: r["total_ms"], reverse=True)[:top]


def kernel_categories(kernels: list[dict[str, Any]]) -> dict[str, float]:
    """Kernel time in ms by category (first matching name pattern; else ``other``).

    Arguments:
        kernels: rows from ``read_summary_csv`` (pass ``top`` large enough to cover every kernel).
    """
    totals: dict[str, float] = {}
    for kernel in kernels:
        name = kernel["name"].lower()
        category = next((c for c, pattern in KERNEL_CATEGORIES if re.search(pattern, name)), "other")
        totals[category] = totals.get(category, 0.0) + kernel["total_ms"]
    return totals


def capture_in_measurement(runs: list[dict[str, Any]], iterations: tuple[int, int]) -> bool | None:
    """Whether engine iterations START-STOP fell inside one measured phase, from the scraped iteration counter
    (None when the server exposes no ``iteration_counter``).

    Arguments:
        runs: per-run results of the benchmark.
        iterations: the capture window.
    """
    spans = [r["server_metrics"]["iteration_counter"] for r in runs
             if r.get("server_metrics") and r["server_metrics"].get("iteration_counter")]
    if not spans:
        return None
    return any(first <= iterations[0] and iterations[1] <= last for first, last in spans)


def run_profile(spec: Any, server_argv: list[str], ready_url: str, iterations: tuple[int, int] = (100, 150),
                ready_timeout_s: float = 600.0, on_done: Any = None) -> dict[str, Any]:
    """Start the server under ``nsys profile``, run the benchmark against it, stop it, summarise the trace.

    Arguments:
        spec: the ``BenchSpec`` of the load (its ``out`` receives the trace and the summaries).
        server_argv: the server command.
        ready_url: HTTP URL that answers 200 once the server is ready.
        iterations: engine iterations between cudaProfilerStart and cudaProfilerStop.
        ready_timeout_s: how long to wait for readiness.
        on_done: progress callback per finished record.
    """
    import asyncio


    nsys = find_nsys()
    if not server_argv:
        raise KitUsageError("no server command given; put it after --, e.g. trtllm-kit profile ... -- tritonserver "
                            "--model-repository out/repo.")
    spec.out.mkdir(parents=True, exist_ok=True)
    report = spec.out / "profile"
    log = spec.out / "server.log"
    argv = profile_argv(nsys, report, server_argv)
    log.unlink(missing_ok=True)
    server = ProcessGroup(log)
    server.start(argv, {**kit_environment(), **profile_env(iterations)})
    try:
        not_ready = server.wait_ready(lambda: answers(ready_url), ready_timeout_s, poll_s=0.1,
                                      ports=(urlsplit(ready_url).port or 80,))
        if not_ready is not None and not_ready.exit_code is not None:
            raise KitError(f"the profiled server exited with code {not_ready.exit_code} before it was ready; "
                           f"last log lines: {log.read_text()[-600:].strip()}")
        if not_ready is not None:
            raise KitError(f"the profiled server was not ready at {ready_url} after {ready_timeout_s:g} s; see {log}.")
        results = asyncio.run(run_bench_async(spec, on_done))
    finally:
        server.stop(300.0)
    rep = report.with_suffix(".nsys-rep")
    if not rep.is_file():
        raise KitError(f"nsys wrote no {rep.name}: the capture range never opened; check that iterations "
                       f"{iterations[0]}-{iterations[1]} fall inside the load (see {log}).")
    csvs = run_stats(nsys, rep, spec.out / "stats")
    kernels = read_summary_csv(csvs["cuda_gpu_kern_sum"], top=10_000) if "cuda_gpu_kern_sum" in csvs else []
    summary = {"nsys_argv": argv, "env": profile_env(iterations), "report": rep.name,
               "stats_csv": {k: v.name for k, v in csvs.items()}, "top_kernels": kernels[:10],
               "kernel_ms_by_category": kernel_categories(kernels),
               "top_nvtx_ranges": read_summary_csv(csvs["nvtx_sum"]) if "nvtx_sum" in csvs else [],
               "bench_valid": results["valid"], "bench_summary": results["files"]["summary"],
               "capture_in_measurement": capture_in_measurement(results["runs"], iterations)}
    (spec.out / "profile_summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary
