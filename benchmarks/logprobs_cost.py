"""What logprobs cost the CPU runtime: output tokens/s with none, with ``logprobs=5`` and with ``logprobs=5`` plus
``prompt_logprobs=5``, in the same run.

    python benchmarks/logprobs_cost.py [--requests 16] [--prompt-len 64] [--max-tokens 64] [--rounds 5] [--json]

The built-in ``tiny-llama`` checkpoint (float32, converted into a temporary directory) runs the same seeded
prompts greedily for each case. The cases are interleaved over ``--rounds`` rounds, so that the load of a shared
machine falls on each alike, and the best round of each counts. An untimed warm-up runs first. Prints tokens/s per
case and its ratio to the case without logprobs.
"""

from __future__ import annotations

import argparse
import json
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

CASES = {"none": {}, "logprobs=5": {"logprobs": 5}, "logprobs=5+prompt": {"logprobs": 5, "prompt_logprobs": 5}}


@dataclass
class Figures:
    case: str
    tokens_per_s: float
    ratio: float


def tokens_per_s(model: CheckpointModel, prompts: list[list[int]], max_tokens: int, fields: dict[str, int]) -> float:
    engine = Executor(model, EngineConfig(max_batch_size=len(prompts), max_num_tokens=4096))
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **fields)
    start = time.perf_counter()
    outputs = engine.generate(prompts, [params] * len(prompts))
    return sum(map(len, outputs)) / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        convert_checkpoint(builtin_dir("tiny-llama"), Path(tmp), dtype="float32")
        model = CheckpointModel.load(Path(tmp))
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 1000, (args.prompt_len,), generator=generator).tolist() for _ in range(args.requests)]
    for fields in CASES.values():  # warm-up
        tokens_per_s(model, prompts[:2], 4, fields)
    best = dict.fromkeys(CASES, 0.0)
    for _ in range(args.rounds):
        for case, fields in CASES.items():
            best[case] = max(best[case], tokens_per_s(model, prompts, args.max_tokens, fields))
    figures = [Figures(case, rate, rate / best["none"]) for case, rate in best.items()]
    if args.json:
        print(json.dumps([asdict(f) for f in figures], indent=2))
        return
    print("  ".join(f"{f.case}: {f.tokens_per_s:.0f} tokens/s ({f.ratio:.2f}x)" for f in figures))


if __name__ == "__main__":
    main()
