"""Inter-token latency of running decodes while long prefills arrive: aggregated against disaggregated serving of
the same llmapi artifact on the CPU, one run each.

    python benchmarks/disagg_interference.py [--decode-streams 4] [--decode-tokens 192] [--long-isl 960]
                                             [--num-long 12] [--prefill-interval-ms 250] [--threads 2] [--seed 0]
                                             [--json]

The artifact is the built-in ``tiny-llama`` built for ``--target llmapi`` into a temporary directory. Each mode is
served with ``trtllm-kit serve --openai-port`` (``--disagg`` for the second), with the same cores split between
the roles: aggregated runs one engine on ``--threads`` torch threads, disaggregated the context and the
generation engine on ``--threads / 2`` each (``OMP_NUM_THREADS`` of the serve). The workload, identical and seeded
in both modes: ``--decode-streams`` streamed completions of ``--decode-tokens`` tokens from 16-token prompts, and,
from their start, ``--num-long`` prompts of ``--long-isl`` tokens with ``max_tokens`` 1, one every
``--prefill-interval-ms``. Printed per
mode: the decode streams' ITL p50 / p99 / max (ms, from each stream's token arrivals at the client, its first
token excluded), the long prompts' latency p50 and the number sent, then the p99 ratio. An untimed warm-up of
both shapes runs first. This is one run on a shared 2-core machine: the figures move with the machine's load, and
the CPU runtime is not a production engine; read them as the direction of the effect, not its size.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from itertools import pairwise
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trtllm_kit.cli import run  # noqa: E402
from trtllm_kit.serve.server.launcher import free_endpoints, free_port  # noqa: E402
from trtllm_kit.serve.service import ServeOptions, serve_detached, stop_serving  # noqa: E402
from trtllm_kit.spec import ServeSettings  # noqa: E402

MODEL = "builtin:tiny-llama"


@dataclass
class ModeResult:
    mode: str
    threads_per_engine: int
    itl_ms_p50: float
    itl_ms_p99: float
    itl_ms_max: float
    num_itls: int
    long_latency_ms_p50: float
    num_long: int


async def stream(session, url: str, prompt: list[int], max_tokens: int) -> list[float]:
    """Arrival times (perf_counter seconds) of each chunk carrying tokens."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    times = []
    async with session.post(f"{url}/completions", json=body) as response:
        assert response.status == 200, await response.text()
        async for line in response.content:
            if line.startswith(b"data: {") and json.loads(line[6:])["choices"][0].get("token_ids"):
                times.append(time.perf_counter())
    return times


async def whole(session, url: str, prompt: list[int]) -> float:
    started = time.perf_counter()
    async with session.post(f"{url}/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 1}) as r:
        assert r.status == 200, await r.text()
        await r.read()
    return time.perf_counter() - started


async def workload(url: str, args: argparse.Namespace) -> tuple[list[float], list[float]]:
    import aiohttp

    g = np.random.default_rng(args.seed)
    shorts = [g.integers(3, 1000, 16).tolist() for _ in range(args.decode_streams)]
    longs = [g.integers(3, 1000, args.long_isl).tolist() for _ in range(args.num_long + 1)]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        await asyncio.gather(stream(session, url, shorts[0], 8), whole(session, url, longs[-1]))  # warm-up
        decodes = [asyncio.create_task(stream(session, url, p, args.decode_tokens)) for p in shorts]
        long_tasks = []
        for prompt in longs[:args.num_long]:
            await asyncio.sleep(args.prefill_interval_ms / 1e3)
            long_tasks.append(asyncio.create_task(whole(session, url, prompt)))
        times = await asyncio.gather(*decodes)
        latencies = await asyncio.gather(*long_tasks)
    itls = [(b - a) * 1e3 for t in times for a, b in pairwise(t[1:])]
    return itls, list(latencies)


def measure(out: Path, mode: str, args: argparse.Namespace) -> ModeResult:
    threads = args.threads if mode == "aggregated" else max(1, args.threads // 2)
    os.environ["OMP_NUM_THREADS"] = str(threads)  # inherited by the serve and its engines
    port = free_port()
    settings = ServeSettings(**asdict(free_endpoints()), ready_timeout_s=180, openai_port=port,
                             disagg=mode == "disaggregated")
    serve_detached(ServeOptions(out=out, settings=settings))
    try:
        itls, latencies = asyncio.run(workload(f"http://127.0.0.1:{port}/v1", args))
    finally:
        stop_serving(out, 30)
    return ModeResult(mode, threads, float(np.percentile(itls, 50)), float(np.percentile(itls, 99)),
                      float(max(itls)), len(itls), float(np.percentile(latencies, 50)) * 1e3, len(latencies))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--decode-streams", type=int, default=4)
    parser.add_argument("--decode-tokens", type=int, default=192)
    parser.add_argument("--long-isl", type=int, default=960)
    parser.add_argument("--num-long", type=int, default=12)
    parser.add_argument("--prefill-interval-ms", type=float, default=250.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        out = Path(work) / "out"
        if run(["build", MODEL, "--target", "llmapi", "--no-verify", "--out", str(out)]) != 0:
            raise SystemExit("the build failed")
        results = [measure(out, mode, args) for mode in ("aggregated", "disaggregated")]
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
        return
    for r in results:
        print(f"{r.mode:>13}: decode ITL p50 {r.itl_ms_p50:6.2f} ms  p99 {r.itl_ms_p99:7.2f} ms  max "
              f"{r.itl_ms_max:7.2f} ms  ({r.num_itls} gaps, {r.threads_per_engine} thread(s) per engine); "
              f"{r.num_long} long prompts of {args.long_isl} tokens, latency p50 {r.long_latency_ms_p50:7.1f} ms")
    print(f"ITL p99 aggregated / disaggregated: {results[0].itl_ms_p99 / results[1].itl_ms_p99:.2f}")


if __name__ == "__main__":
    main()
