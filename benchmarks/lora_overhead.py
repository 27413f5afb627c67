"""What LoRA adapters cost the CPU runtime: decode throughput of one batch with 0, 1 and 8 distinct adapters.

    python benchmarks/lora_overhead.py [--model builtin:tiny-llama] [--rank 16] [--batch 8] [--rounds 5] [--json]

The base model is built once for the cpu target (float32). Each adapter has random A and B of ``--rank`` on every
linear the family has (the most work an adapter can add). The three cases run in the same process, in interleaved
rounds after an untimed warm-up, on the same prompts (seeded), with KV block reuse off so every round computes the
same tokens: ``base`` (no adapter), ``1 adapter`` (every sequence runs the same one) and ``8 adapters`` (sequence i
runs adapter i mod 8). Prints the median generated tokens per wall-clock second and per CPU second of each case
(one torch thread; CPU time is steadier than wall time on a shared machine) and each case's CPU time per token
against the base's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from trtllm_kit.cli import run
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.executor import Executor
from trtllm_kit.runtime.lora import AdapterWeights, Pair, module_shapes
from trtllm_kit.runtime.model import CheckpointModel
from trtllm_kit.runtime.sequence import SamplingParams

CASES = {"base": 0, "1 adapter": 1, "8 adapters": 8}


@dataclass(frozen=True)
class LoraOverhead:
    """Median tokens/s per case, and each case's throughput relative to the base."""

    model: str
    rank: int
    batch: int
    prompt_tokens: int
    max_tokens: int
    rounds: int
    tokens_per_s: dict[str, float]  # generated tokens per wall-clock second
    tokens_per_cpu_s: dict[str, float]  # per second of this process's CPU time (steadier on a shared machine)

    @property
    def overhead_pct(self) -> dict[str, float]:
        """Each case's CPU time per token against the base's, in percent more."""
        base = self.tokens_per_cpu_s["base"]
        return {case: round(100 * (base / rate - 1), 1) for case, rate in self.tokens_per_cpu_s.items()}


def random_adapter(config: dict, rank: int, seed: int) -> dict[tuple[int, str], Pair]:
    """An adapter of ``rank`` on every module of every layer, A and B random (small, so the tokens stay sane)."""
    g = torch.Generator().manual_seed(seed)
    return {(layer, module): (torch.randn(rank, fan_in, generator=g) * 0.01, torch.randn(fan_out, rank, generator=g)
                              * 0.01)
            for layer in range(int(config["num_hidden_layers"]))
            for module, (fan_in, fan_out) in module_shapes(config).items()}


def measure(model: CheckpointModel, adapters: list[dict[tuple[int, str], Pair]], batch: int, prompt_tokens: int,
            max_tokens: int, rounds: int) -> tuple[dict[str, float], dict[str, float]]:
    """Median generated tokens per wall-clock second and per CPU second of each case over ``rounds`` interleaved
    rounds."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, model.dims.vocab_size, (prompt_tokens,), generator=g).tolist() for _ in range(batch)]
    params = [SamplingParams(max_tokens=max_tokens, min_tokens=max_tokens) for _ in range(batch)]
    engine = Executor(model, EngineConfig(max_batch_size=batch, enable_kv_cache_reuse=False,
                                        lora_cache_max_adapters=len(adapters)))

    def loras(num_adapters: int) -> list[AdapterWeights | None]:
        if num_adapters == 0:
            return [None] * batch
        return [AdapterWeights(1 + i % num_adapters, adapters[i % num_adapters]) for i in range(batch)]

    for num_adapters in CASES.values():  # untimed warm-up
        engine.generate(prompts, params, loras(num_adapters))
    wall: dict[str, list[float]] = {case: [] for case in CASES}
    cpu: dict[str, list[float]] = {case: [] for case in CASES}
    for _ in range(rounds):
        for case, num_adapters in CASES.items():
            requests = loras(num_adapters)
            started, started_cpu = time.perf_counter(), time.process_time()
            tokens = sum(map(len, engine.generate(prompts, params, requests)))
            wall[case].append(tokens / (time.perf_counter() - started))
            cpu[case].append(tokens / (time.process_time() - started_cpu))
    return ({case: round(statistics.median(rates), 1) for case, rates in wall.items()},
            {case: round(statistics.median(rates), 1) for case, rates in cpu.items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="builtin:tiny-llama", help="The base model (a builtin or an HF dir).")
    parser.add_argument("--rank", type=int, default=16, help="Every adapter's rank.")
    parser.add_argument("--batch", type=int, default=8, help="Sequences in the batch.")
    parser.add_argument("--prompt-tokens", type=int, default=32, help="Tokens of each prompt.")
    parser.add_argument("--max-tokens", type=int, default=32, help="Tokens generated per sequence.")
    parser.add_argument("--rounds", type=int, default=5, help="Timed rounds of the three cases.")
    parser.add_argument("--json", action="store_true", help="Print the figures as JSON.")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)  # CPU time then counts one thread's work, as wall time does
    with tempfile.TemporaryDirectory(prefix="lora-overhead-") as tmp:
        out = Path(tmp) / "out"
        with contextlib.redirect_stdout(sys.stderr):  # the build's progress stays off the figures (--json)
            if run(["build", args.model, "--target", "cpu", "--dtype", "float32", "--no-verify", "--until",
                    "checkpoint", "--out", str(out)]) != 0:
                raise SystemExit(1)
        model = CheckpointModel.load(out / "checkpoint")
    adapters = [random_adapter(model.config, args.rank, seed) for seed in range(max(CASES.values()))]
    rates, cpu_rates = measure(model, adapters, args.batch, args.prompt_tokens, args.max_tokens, args.rounds)
    result = LoraOverhead(args.model, args.rank, args.batch, args.prompt_tokens, args.max_tokens, args.rounds, rates,
                          cpu_rates)
    if args.json:
        print(json.dumps({**asdict(result), "overhead_pct": result.overhead_pct}))
        return
    overhead = result.overhead_pct
    print(f"{args.model}, batch {args.batch}, prompts of {args.prompt_tokens} tokens, {args.max_tokens} generated, "
          f"adapters of rank {args.rank} on every linear; median of {args.rounds} interleaved rounds: "
          + ", ".join(f"{case} {rate:.1f} tokens/s, {cpu_rates[case]:.1f} tokens per CPU-s"
                      + (f" ({overhead[case]:+.1f}% CPU time per token)" if case != "base" else "")
                      for case, rate in rates.items()))
    print(f"reproduce: python benchmarks/lora_overhead.py --model {args.model} --rank {args.rank} --batch {args.batch} "
          f"--prompt-tokens {args.prompt_tokens} --max-tokens {args.max_tokens} --rounds {args.rounds}")


if __name__ == "__main__":
    main()
