"""``serve --dynamo``'s routing and frontend, measured here: the shared-prefix workload on 2 CPU workers with a
bounded KV cache under ``--router kv`` and ``--router round-robin`` (the hit rate the workers counted and the one
their routing allows, against the ideal; TTFT p50/p99), and the Dynamo frontend's latency per request against the
kit's own frontend on the same artifact.

    python benchmarks/dynamo_routing.py [--prefixes 8] [--users 16] [--turns 3] [--prefix-tokens 512]
        [--kv-tokens 4096] [--concurrency 4] [--seeds 0,1] [--routers kv,round-robin] [--sequential 100]
        [--pairs 0] [--pair-gaps-ms 0,20,50]

Builds ``builtin:tiny-llama`` for the CPU runtime with a KV pool of ``--kv-tokens`` tokens per worker
(``max_tokens_in_paged_kv_cache``; 0: the default, ``max_batch_size`` x ``max_seq_len``), then, one serve at a
time on 127.0.0.1:
- for each seed, ``serve --dynamo --workers 2 --router R`` for R in ``--routers``, and ``bench --workload
  shared-prefix`` against it: the workers' ``trtllm_kit:prefix_cache_*`` counters over the run (``counted``), the
  hit rate modelled from which worker served each request (``profile/prefix_hits.py``, a cache that never evicts)
  and the ideal (every request in one unbounded cache). With more prefixes than one worker's pool holds, a router
  that spreads each prefix over both workers makes them evict what the next request needs. The serve hands its
  environment to Dynamo's frontend, so a ``DYN_ROUTER_*`` variable set here runs another router setting;
- with ``--pairs N``, ``serve --dynamo --workers 2 --router kv`` and, for each gap in ``--pair-gaps-ms``, N pairs of
  users of one new ``--prefix-tokens`` prefix (32 tokens of their own each, 16-token replies), the second sent that
  long after the first: how many pairs one worker served (a second user routed before the router knows where the
  prefix went lands on the other worker);
- ``serve --openai-port P`` (the kit's frontend on Triton) and ``serve --dynamo --workers 1``: ``--sequential``
  non-streamed 1-token completions of one short prompt each, after 10 untimed; the p50 of each and their
  difference.
Prints one line per figure, with units, and the load average beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from trtllm_kit.build.pipeline import run_build
from trtllm_kit.profile.prefix_hits import response_request_id, served_by
from trtllm_kit.profile.shared_prefix import SharedPrefixSpec, add_spec_arguments, spec_of
from trtllm_kit.profile.shared_prefix_run import SharedPrefixResult, run_shared_prefix
from trtllm_kit.serve.dynamo.launch import serve_net
from trtllm_kit.serve.server.launcher import free_endpoints, free_port
from trtllm_kit.serve.service import ServeOptions, serve_detached, stop_serving
from trtllm_kit.spec import ServeSettings, build_spec

PROMPT_IDS = [1, 264, 333, 84, 534, 332]
WARMUP = 10


def _serve(out: Path, **settings: Any) -> tuple[str, dict[str, Any]]:
    """Serve OUT; the URL of its OpenAI frontend (Dynamo's own for a --dynamo serve) and its state."""
    port = free_port()
    state = serve_detached(ServeOptions(out=out, settings=ServeSettings(
        **asdict(free_endpoints()), openai_port=port, ready_timeout_s=180, **settings)))
    return f"http://{state.get('dynamo_frontend') or f'127.0.0.1:{port}'}", state


def _load() -> str:
    return "load average {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def _routing(out: Path, router: str, spec: SharedPrefixSpec, concurrency: int, root: Path) -> SharedPrefixResult:
    url, state = _serve(out, dynamo=True, workers=2, router=router)
    logs = Path(state["run_dir"]) / "dynamo"
    net = serve_net(logs)  # Dynamo's frontend and the workers' /metrics answer in the serve's namespace alone
    try:
        return net.call(lambda: asyncio.run(run_shared_prefix(spec, f"{url}/v1", root / f"bench-{router}",
                                                              concurrency, logs)))
    finally:
        net.close()
        stop_serving(out, 30)


def _pairs_together(out: Path, num_pairs: int, gaps_ms: list[float], prefix_tokens: int,
                    vocab: tuple[int, int] = (100, 1000)) -> dict[float, int]:
    """For each gap, how many of ``num_pairs`` pairs of users of one new prefix one worker served."""
    url, state = _serve(out, dynamo=True, workers=2, router="kv")
    logs = Path(state["run_dir"]) / "dynamo"
    rng = random.Random(0)

    def post(prompt: list[int]) -> str:
        body = json.dumps({"model": state["model"], "prompt": prompt, "max_tokens": 16, "temperature": 0,
                           "ignore_eos": True}).encode()
        request = urllib.request.Request(f"{url}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            return str(json.loads(response.read())["id"])

    def send(gap_s: float) -> list[tuple[str, str]]:
        ids = []
        with ThreadPoolExecutor(2) as pool:
            for _ in range(num_pairs):
                prefix = [rng.randrange(*vocab) for _ in range(prefix_tokens)]
                first, second = (prefix + [rng.randrange(*vocab) for _ in range(32)] for _ in range(2))
                sent = pool.submit(post, first)
                time.sleep(gap_s)
                second_id = post(second)
                ids.append((sent.result(), second_id))
        return ids

    net = serve_net(logs)  # Dynamo's frontend answers in the serve's network namespace alone
    try:
        sent_ids = {gap: net.call(partial(send, gap / 1000)) for gap in gaps_ms}
        time.sleep(0.5)  # the workers' last log lines reach their files
        workers = served_by(logs)
    finally:
        net.close()
        stop_serving(out, 30)
    return {gap: sum(len({workers.get(response_request_id(i)) for i in pair} - {None}) == 1 for pair in pairs)
            for gap, pairs in sent_ids.items()}


def _sequential_p50_ms(out: Path, count: int, **settings: Any) -> float:
    url, state = _serve(out, **settings)
    body = json.dumps({"model": state["model"], "prompt": PROMPT_IDS, "max_tokens": 1, "temperature": 0}).encode()
    times = []

    def send() -> None:
        for number in range(WARMUP + count):
            request = urllib.request.Request(f"{url}/v1/completions", data=body,
                                             headers={"Content-Type": "application/json"})
            start = time.perf_counter_ns()
            with urllib.request.urlopen(request, timeout=60) as response:
                assert response.status == 200
                response.read()
            if number >= WARMUP:
                times.append((time.perf_counter_ns() - start) / 1e6)

    # Dynamo's frontend answers in the serve's network namespace alone
    net = serve_net(Path(state["run_dir"]) / "dynamo") if "dynamo_frontend" in state else None
    try:
        if net is None:
            send()
        else:
            net.call(send)
    finally:
        if net is not None:
            net.close()
        stop_serving(out, 30)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_spec_arguments(parser, SharedPrefixSpec(num_prefixes=8))
    parser.add_argument("--kv-tokens", type=int, default=4096,
                        help="KV pool per worker in tokens (max_tokens_in_paged_kv_cache; 0: the default).")
    parser.add_argument("--seeds", default="0,1",
                        help="Comma-separated workload seeds; each runs every --routers ('': none).")
    parser.add_argument("--routers", default="kv,round-robin", help="Comma-separated routers run for each seed.")
    parser.add_argument("--pairs", type=int, default=0,
                        help="Pairs of users of one prefix sent apart by each --pair-gaps-ms (0: none).")
    parser.add_argument("--pair-gaps-ms", default="0,20,50", help="Comma-separated gaps between a pair's requests.")
    parser.add_argument("--sequential", type=int, default=100,
                        help="Timed 1-token completions per frontend (0: skip the frontends).")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dynamo-routing.") as tmp:
        root = Path(tmp)
        out = root / "out"
        repo = {"max_tokens_in_paged_kv_cache": args.kv_tokens} if args.kv_tokens else {}
        run_build(build_spec({}, {"model": "builtin:tiny-llama", "out": out, "repo": repo,
                                  "build": {"verify": False, "target": "cpu"}}))
        for seed in (int(s) for s in args.seeds.split(",") if s):
            spec = spec_of(args, seed)
            for router in args.routers.split(","):
                result = _routing(out, router, spec, args.concurrency, root / f"seed{seed}")
                print(f"seed {seed}, --router {router}, KV pool {args.kv_tokens or 'default'} tokens per worker: "
                      f"{result.line()} [{_load()}]", flush=True)
        if args.pairs:
            gaps = [float(g) for g in args.pair_gaps_ms.split(",") if g]
            together = _pairs_together(out, args.pairs, gaps, args.prefix_tokens)
            for gap, count in together.items():
                print(f"pairs of users of one {args.prefix_tokens}-token prefix, the second sent {gap:.0f} ms after "
                      f"the first, --router kv on 2 workers: {count} of {args.pairs} on one worker [{_load()}]",
                      flush=True)
        if args.sequential < 1:
            return 0
        plain = _sequential_p50_ms(out, args.sequential)
        dynamo = _sequential_p50_ms(out, args.sequential, dynamo=True, workers=1)
        print(f"sequential 1-token completions, p50 of {args.sequential}: kit frontend {plain:.2f} ms, Dynamo "
              f"frontend {dynamo:.2f} ms, difference {dynamo - plain:+.2f} ms per request [{_load()}]", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
