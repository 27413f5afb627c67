"""What Ray Serve adds to a served request: the tiny llmapi build served plainly and with ``serve --ray`` (one
replica), each timed from start to ready, over sequential one-token completions (p50, p99) and to a full stop.

    python benchmarks/ray_overhead.py [--requests 100] [--workdir DIR]

Needs the ``ray`` extra and root (``serve --ray`` runs Ray in a network namespace of its own).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from trtllm_kit.serve.server.launcher import free_port

KIT = [sys.executable, "-m", "trtllm_kit"]


def kit(*args: str) -> None:
    subprocess.run([*KIT, *args], check=True, capture_output=True, text=True)


def completion_ms(port: int, model: str) -> float:
    body = json.dumps({"model": model, "prompt": "Hello", "max_tokens": 1, "temperature": 0}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()
    return (time.perf_counter() - start) * 1000


def measure(out: Path, extra: list[str], requests: int) -> dict[str, float]:
    port = free_port()
    start = time.perf_counter()
    kit("serve", str(out), "--openai-port", str(port), "--detach", *extra)
    ready_s = time.perf_counter() - start
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30) as response:
            model = json.loads(response.read())["data"][0]["id"]
        completion_ms(port, model)  # warm-up
        times = sorted(completion_ms(port, model) for _ in range(requests))
    finally:
        stop = time.perf_counter()
        kit("stop", str(out))
        stop_s = time.perf_counter() - stop
    return {"ready_s": ready_s, "p50_ms": statistics.median(times),
            "p99_ms": times[min(len(times) - 1, int(0.99 * len(times)))], "stop_s": stop_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="ray-overhead-"))
    out = work / "out"
    if not (out / "manifest.json").is_file():
        kit("build", "builtin:tiny-llama", "--target", "llmapi", "--out", str(out))
    rows = {"plain": measure(out, [], args.requests),
            "ray": measure(out, ["--ray", "--replicas", "1:1"], args.requests)}
    print(f"{'serve':8} {'ready s':>8} {'p50 ms':>8} {'p99 ms':>8} {'stop s':>8}")
    for name, row in rows.items():
        print(f"{name:8} {row['ready_s']:8.1f} {row['p50_ms']:8.1f} {row['p99_ms']:8.1f} {row['stop_s']:8.1f}")


if __name__ == "__main__":
    main()
