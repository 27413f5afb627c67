"""The gateway's added latency per request: the OpenAI frontend with ``--api-keys`` against the bare frontend, in
the same run, over the same tritonserver.

    python benchmarks/gateway.py [--requests 300] [--json]

Builds the tiny Llama (CPU runtime), serves it with ``trtllm-kit serve --detach`` (no frontend), and starts two
frontends in this process on the same Triton: one bare, one behind a key file (one key with a requests/s bucket, a
tokens/min bucket and a daily quota, so every check runs; the usage log is appended per request).
Requests are token-id completions of one token, sent one at a time, alternating bare and gateway after an untimed
warm-up. Prints each side's end-to-end p50/p99, the paired difference (gateway − bare, consecutive pairs), and
the time spent inside the gateway middleware itself (its total minus the handler's), p50/p99.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aiohttp import web  # noqa: E402

from trtllm_kit.build.pipeline import run_build  # noqa: E402
from trtllm_kit.serve.frontend import OpenAIFrontend, start_frontend  # noqa: E402
from trtllm_kit.serve.gateway.keys import add_key  # noqa: E402
from trtllm_kit.serve.openai.config import OpenAIConfig  # noqa: E402
from trtllm_kit.serve.server.launcher import free_endpoints, free_port  # noqa: E402
from trtllm_kit.serve.service import ServeOptions, serve_detached, stop_serving  # noqa: E402
from trtllm_kit.spec import ServeSettings, build_spec  # noqa: E402

MODEL = "builtin:tiny-llama"


@dataclass
class Figures:
    requests: int
    bare_p50_ms: float
    bare_p99_ms: float
    gateway_p50_ms: float
    gateway_p99_ms: float
    added_p50_ms: float  # paired difference, gateway − bare
    added_p99_ms: float
    middleware_p50_ms: float  # time inside the gateway middleware, excluding the handler
    middleware_p99_ms: float


def timed_gateway(frontend: OpenAIFrontend, spent: list[float]) -> None:
    """Wrap the frontend's gateway middleware so that its own time (total minus the handler's) is recorded."""
    gateway = frontend.gateway
    assert gateway is not None
    inner = gateway.middleware

    @web.middleware
    async def middleware(request: web.Request, handler):
        in_handler = 0.0

        async def timed_handler(req: web.Request) -> web.StreamResponse:
            nonlocal in_handler
            started = time.perf_counter()
            try:
                return await handler(req)
            finally:
                in_handler += time.perf_counter() - started

        started = time.perf_counter()
        try:
            return await inner(request, timed_handler)
        finally:
            spent.append(time.perf_counter() - started - in_handler)

    gateway.middleware = middleware  # type: ignore[method-assign]


async def measure(grpc_url: str, tokenizer: Path, keys: Path, secret: str, num_requests: int) -> Figures:
    bare = OpenAIFrontend(OpenAIConfig(grpc_url=grpc_url, served_name=MODEL, tokenizer_dir=tokenizer))
    gated = OpenAIFrontend(OpenAIConfig(grpc_url=grpc_url, served_name=MODEL, tokenizer_dir=tokenizer, api_keys=keys))
    spent: list[float] = []
    timed_gateway(gated, spent)
    ports = free_port(), free_port()
    runners = [await start_frontend(bare, "127.0.0.1", ports[0]), await start_frontend(gated, "127.0.0.1", ports[1])]
    body = {"model": MODEL, "prompt": [5, 6, 7, 8], "max_tokens": 1, "ignore_eos": True}
    headers = {"Authorization": f"Bearer {secret}"}
    times: dict[int, list[float]] = {0: [], 1: []}
    try:
        async with aiohttp.ClientSession() as session:
            for i in range(num_requests * 2 + 20):
                side = i % 2
                started = time.perf_counter()
                async with session.post(f"http://127.0.0.1:{ports[side]}/v1/completions", json=body,
                                        headers=headers) as response:
                    assert response.status == 200, await response.text()
                    await response.read()
                if i >= 20:  # untimed warm-up
                    times[side].append(time.perf_counter() - started)
    finally:
        for runner in runners:
            await runner.cleanup()
    b, g = np.array(times[0]) * 1e3, np.array(times[1]) * 1e3
    added, own = g - b, np.array(spent[10:]) * 1e3

    def pct(values: np.ndarray, q: float) -> float:
        return round(float(np.percentile(values, q)), 3)

    return Figures(num_requests, pct(b, 50), pct(b, 99), pct(g, 50), pct(g, 99), pct(added, 50), pct(added, 99),
                   pct(own, 50), pct(own, 99))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="Timed requests per side.")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        run_build(build_spec({}, {"model": MODEL, "out": out, "build": {"verify": False}}))
        keys = Path(tmp) / "keys.json"
        secret, _ = add_key(keys, "bench", tenant="bench", models=(MODEL,), rps=1e6, tpm=10**9,
                            quota_tokens=10**12, quota_period="day")
        endpoints = free_endpoints()
        serve_detached(ServeOptions(out=out, settings=ServeSettings(**asdict(endpoints), ready_timeout_s=120)))
        try:
            figures = asyncio.run(measure(endpoints.url("grpc"), out / "tokenizer", keys, secret, args.requests))
        finally:
            stop_serving(out, 30)
    if args.json:
        print(json.dumps(asdict(figures)))
        return
    f = figures
    print(f"gateway, {f.requests} requests per side (1 output token, token-id prompt): bare p50 {f.bare_p50_ms} ms "
          f"p99 {f.bare_p99_ms} ms; gateway p50 {f.gateway_p50_ms} ms p99 {f.gateway_p99_ms} ms; added (paired) "
          f"p50 {f.added_p50_ms} ms p99 {f.added_p99_ms} ms; inside the middleware p50 {f.middleware_p50_ms} ms "
          f"p99 {f.middleware_p99_ms} ms")


if __name__ == "__main__":
    main()
