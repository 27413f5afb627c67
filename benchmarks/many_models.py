"""Several models on one server: the A/B alias's shares over many requests, and a hot reload under load.

    python benchmarks/many_models.py [--requests 1000] [--json]

Builds three tiny Llamas (CPU runtime: a, b and a's next version), serves a and b on one tritonserver with
``--alias chat=a:90,b:10`` and sends ``--requests`` one-token completions for ``chat`` without ``user`` (8 at a
time); then keeps 6 four-token requests for ``a`` in flight, reloads ``a`` with the new build once 60 have been
answered, and goes on until 60 more have been answered after the reload returned. Prints the shares with the 4
standard-deviation binomial tolerance, the requests answered by each version, the failures and the reload's times.
Last, ``trtllm-kit bench --openai-url`` runs a closed loop of 4 for ``--bench-seconds`` against ``a`` while ``a`` is
reloaded a second time after a third of it, and its own report counts the requests and the failed ones.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trtllm_kit.build.pipeline import run_build  # noqa: E402
from trtllm_kit.serve.fleet.reload import request_reload  # noqa: E402
from trtllm_kit.serve.server.launcher import free_endpoints, free_port  # noqa: E402
from trtllm_kit.serve.service import ServeOptions, serve_detached, stop_serving  # noqa: E402
from trtllm_kit.spec import ServeSettings, build_spec  # noqa: E402

MODEL = "builtin:tiny-llama"
SHARE_A = 0.9


@dataclass
class Figures:
    alias_requests: int
    alias_a: int
    alias_b: int
    tolerance: float  # 4 binomial standard deviations, in requests
    reload_requests: int
    reload_failed: int
    on_v1: int
    on_v2: int
    in_flight_at_switch: int
    switch_s: float  # from the reload request to the route switch (the new models loaded)
    reload_s: float  # to the old version drained, unloaded and deleted
    bench_requests: int = 0  # trtllm-kit bench's measured requests across the second reload
    bench_failed: int = 0
    bench_reload_s: float = 0.0


async def complete(http: aiohttp.ClientSession, port: int, model: str, max_tokens: int, i: int) -> tuple[int, str]:
    body = {"model": model, "prompt": [3 + i % 11, 4, 5], "max_tokens": max_tokens, "ignore_eos": True}
    async with http.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as response:
        answer = await response.json()
        return response.status, answer.get("system_fingerprint", "")


async def measure(port: int, served: Path, new: Path, num_requests: int) -> Figures:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        todo = iter(range(num_requests))
        alias: list[tuple[int, str]] = []

        async def alias_worker() -> None:
            for i in todo:
                alias.append(await complete(http, port, "chat", 1, i))

        await asyncio.gather(*(alias_worker() for _ in range(8)))
        assert all(status == 200 for status, _ in alias), alias
        shares = Counter(fingerprint.rsplit("-v", 1)[0] for _, fingerprint in alias)

        results: list[tuple[int, str]] = []
        started, finished = asyncio.Event(), []
        issued = iter(range(100_000))

        async def load_worker() -> None:
            for i in issued:
                if finished and len(results) >= finished[0] + 60:
                    return
                results.append(await complete(http, port, "a", 4, i))
                if len(results) >= 60:
                    started.set()

        async def reload() -> dict:
            await started.wait()
            result = await asyncio.get_running_loop().run_in_executor(None, request_reload, served, "a", new, 300.0)
            finished.append(len(results))
            return result

        *_, result = await asyncio.gather(*(load_worker() for _ in range(6)), reload())
    versions = Counter(fingerprint for status, fingerprint in results if status == 200)
    return Figures(len(alias), shares["a"], shares["b"], round(4 * math.sqrt(len(alias) * SHARE_A * (1 - SHARE_A)), 1),
                   len(results), sum(status != 200 for status, _ in results), versions["a-v1"], versions["a-v2"],
                   result["in_flight_at_switch"], result["switch_s"], result["total_s"])


def bench_across_reload(port: int, served: Path, new: Path, seconds: float, results: Path) -> tuple[int, int, float]:
    """``trtllm-kit bench`` against ``a`` while ``a`` is reloaded with ``new``: (requests, failed, reload seconds)."""
    argv = [sys.executable, "-m", "trtllm_kit", "bench", "--openai-url", f"http://127.0.0.1:{port}/v1", "--model", "a",
            "--concurrency", "4", "--duration", str(seconds), "--isl", "8", "--osl", "4", "--vocab-size", "200",
            "--warmup", "2", "--no-plots", "--max-client-lag", "1000", "--out", str(results)]
    bench = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(seconds / 3)
        reloaded = request_reload(served, "a", new, 300.0)
        _, stderr = bench.communicate(timeout=seconds * 4 + 120)
    finally:
        if bench.poll() is None:
            bench.kill()
    summary = json.loads((results / "summary.json").read_text())
    if not summary["runs"]:
        raise SystemExit(f"bench measured nothing (exit {bench.returncode}): {stderr[-2000:]}")
    return (sum(run["num_requests"] for run in summary["runs"]), sum(run["num_errors"] for run in summary["runs"]),
            reloaded["total_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000, help="Requests for the alias.")
    parser.add_argument("--bench-seconds", type=float, default=30.0, help="Length of the bench run across a reload.")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        one_each = {"preprocessing_instances": 1, "postprocessing_instances": 1, "bls_instances": 1}
        outs = {name: Path(tmp) / name for name in ("a", "b", "a2", "a3")}
        for out in outs.values():
            run_build(build_spec({}, {"model": MODEL, "out": out, "build": {"verify": False, "max_batch_size": 8},
                                      "repo": one_each}))
        port = free_port()
        serve_detached(ServeOptions(out=outs["a"], more=(outs["b"],), names=(f"a={outs['a']}", f"b={outs['b']}"),
                                    aliases=("chat=a:90,b:10",),
                                    settings=ServeSettings(**asdict(free_endpoints()), ready_timeout_s=120,
                                                           openai_port=port)))
        try:
            time.sleep(1.0)
            figures = asyncio.run(measure(port, outs["a"], outs["a2"], args.requests))
            figures.bench_requests, figures.bench_failed, figures.bench_reload_s = bench_across_reload(
                port, outs["a"], outs["a3"], args.bench_seconds, Path(tmp) / "bench")
        finally:
            stop_serving(outs["a"], 30)
    if args.json:
        print(json.dumps(asdict(figures)))
        return
    f = figures
    print(f"alias chat=a:90,b:10 over {f.alias_requests} requests: a {f.alias_a}, b {f.alias_b} (tolerance "
          f"+-{f.tolerance:g}); reload of a under load: {f.reload_requests} requests, {f.reload_failed} failed, "
          f"{f.on_v1} on v1 and {f.on_v2} on v2, {f.in_flight_at_switch} in flight at the switch, switched after "
          f"{f.switch_s:.2f} s, reload done in {f.reload_s:.2f} s; trtllm-kit bench across a second reload "
          f"({f.bench_reload_s:.2f} s): {f.bench_requests} requests, {f.bench_failed} failed")


if __name__ == "__main__":
    main()
