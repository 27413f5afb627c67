"""In-flight against static batching on the CPU runtime: one seeded workload through both, in the same run.

    python benchmarks/batching.py [--requests 160] [--rate 200] [--max-batch-size 16] [--seed 0] [--json]

The workload: prompts of 16-64 tokens; skewed output lengths (most replies short, one in eight long:
4-16 or 160-256 tokens); Poisson arrivals at ``--rate`` requests/s, above what static batching sustains,
so that both modes run saturated. Each mode replays the same arrivals in real time on the built-in
``tiny-llama`` checkpoint (float32, converted into a temporary directory) with the same pool and limits:

* in-flight: ``max_utilization`` with chunked context: finished sequences leave and waiting ones join at
  every step;
* static: the ``static`` scheduler mode: a batch of up to ``--max-batch-size`` requests starts only when the
  previous batch has finished completely; finished members keep their slot and compute until then.

Prints per mode the output tokens/s (all output tokens / time from the first arrival to the last finish) and
the p50/p99 request latency (arrival to last token) and the CPU seconds spent (comparable when other processes
share the cores), then their ratios. An untimed warm-up runs first.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trtllm_kit.checkpoint.convert import convert_checkpoint  # noqa: E402
from trtllm_kit.models.builtin import builtin_dir  # noqa: E402
from trtllm_kit.runtime.config import EngineConfig  # noqa: E402
from trtllm_kit.runtime.executor import Executor  # noqa: E402
from trtllm_kit.runtime.model import CheckpointModel  # noqa: E402
from trtllm_kit.runtime.sequence import SamplingParams  # noqa: E402

VOCAB = 1031


@dataclass
class Request:
    arrival_s: float
    prompt_ids: list[int]
    max_tokens: int


@dataclass
class Figures:
    mode: str
    requests: int
    output_tokens: int
    wall_s: float
    tokens_per_s: float
    p50_latency_s: float
    p99_latency_s: float
    cpu_s: float
    steps: int
    mean_batch: float


def workload(num_requests: int, rate: float, seed: int) -> list[Request]:
    """Seeded prompts, skewed output lengths and Poisson arrival times.

    Arguments:
        num_requests: how many; rate: mean arrivals per second; seed: the random seed.
    """
    rng, clock, requests = random.Random(seed), 0.0, []
    for _ in range(num_requests):
        clock += rng.expovariate(rate)
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(16, 64))]
        long = rng.random() < 1 / 8
        requests.append(Request(clock, prompt, rng.randint(160, 256) if long else rng.randint(4, 16)))
    return requests


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def replay(model: CheckpointModel, config: EngineConfig, requests: list[Request], mode: str) -> Figures:
    """Feed the requests at their arrival times into a fresh engine and step it until all have finished.

    Arguments:
        model: the loaded checkpoint; config: engine settings; requests: the workload; mode: its label.
    """
    engine, pending, latencies = Executor(model, config), list(requests), []
    arrivals: dict[int, float] = {}
    start, cpu_start = time.perf_counter(), time.process_time()
    while pending or engine.has_work():
        now = time.perf_counter() - start
        while pending and pending[0].arrival_s <= now:
            request = pending.pop(0)
            seq = engine.add_request(request.prompt_ids, SamplingParams(max_tokens=request.max_tokens),
                                     arrival_time=start + request.arrival_s)
            arrivals[seq.seq_id] = request.arrival_s
        if not engine.has_work():
            time.sleep(max(0.0, pending[0].arrival_s - now))
            continue
        _, finished = engine.step()
        done = time.perf_counter() - start
        latencies += [done - arrivals[seq.seq_id] for seq in finished]
    wall = time.perf_counter() - start - requests[0].arrival_s
    tokens = sum(r.max_tokens for r in requests)
    return Figures(mode, len(requests), tokens, wall, tokens / wall, percentile(latencies, 50),
                   percentile(latencies, 99), time.process_time() - cpu_start, engine.num_steps,
                   engine.total_scheduled / max(engine.num_steps, 1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=160)
    parser.add_argument("--rate", type=float, default=200.0, help="mean arrivals per second")
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--checkpoint", type=Path, help="a TensorRT-LLM checkpoint (default: tiny-llama, float32)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if args.checkpoint:
        model = CheckpointModel.load(args.checkpoint)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            convert_checkpoint(builtin_dir("tiny-llama"), Path(tmp) / "ckpt", dtype="float32")
            model = CheckpointModel.load(Path(tmp) / "ckpt")
    requests = workload(args.requests, args.rate, args.seed)
    common = dict(max_batch_size=args.max_batch_size, max_num_tokens=1024, tokens_per_block=32,
                  max_tokens_in_paged_kv_cache=args.max_batch_size * 320, enable_kv_cache_reuse=False)
    configs = {"in-flight": EngineConfig(batch_scheduler_policy="max_utilization", enable_chunked_context=True,
                                         **common),
               "static": EngineConfig(batch_scheduler_policy="static", **common)}
    Executor(model, configs["in-flight"]).generate([r.prompt_ids for r in requests[:8]],
                                                 [SamplingParams(max_tokens=8)] * 8)  # warm-up, untimed
    figures = [replay(model, config, requests, mode) for mode, config in configs.items()]
    inflight, static = figures
    ratios = {"throughput_ratio": inflight.tokens_per_s / static.tokens_per_s,
              "p50_latency_ratio": inflight.p50_latency_s / static.p50_latency_s,
              "p99_latency_ratio": inflight.p99_latency_s / static.p99_latency_s}
    if args.json:
        print(json.dumps({"figures": [asdict(f) for f in figures], **ratios}, indent=2))
        return
    for f in figures:
        print(f"{f.mode:>9}: {f.tokens_per_s:7.1f} tokens/s  p50 {f.p50_latency_s:6.2f} s  p99 {f.p99_latency_s:6.2f} s"
              f"  ({f.requests} requests, {f.output_tokens} output tokens in {f.wall_s:.2f} s, {f.cpu_s:.2f} CPU-s, "
              f"{f.steps} steps, mean batch {f.mean_batch:.1f})")
    print(f"in-flight / static: throughput {ratios['throughput_ratio']:.2f}x, p50 latency "
          f"{ratios['p50_latency_ratio']:.2f}x, p99 latency {ratios['p99_latency_ratio']:.2f}x")


if __name__ == "__main__":
    main()
