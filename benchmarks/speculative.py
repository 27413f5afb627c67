"""Speculative decoding on the CPU runtime with the real model (SmolLM2-135M-Instruct, float32), greedy.

    python benchmarks/speculative.py [--max-tokens 192] [--max-draft-len 4] [--concurrency 1] \
        [--draft-layers 6] [--json]

The workload is copy-heavy: the chat-templated request "rewrite this code with one change" with the code given,
``--concurrency`` copies at once. Three runs of the same engine settings, each after an untimed warm-up:
without speculation, with prompt lookup (``ngram``), and with draft-target, the draft being the model's first
``--draft-layers`` layers under its own norm and head (written into a temporary directory; 0 skips it). Prints
per run, as it ends, the output tokens/s (and the CPU seconds the run spent), the acceptance length
(1 + accepted / drafts), whether the output equals the run without speculation token for token, and the 1-minute
load average (other processes share the cores).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from trtllm_kit.llmapi.load import load_unified  # noqa: E402
from trtllm_kit.models.builtin import builtin_dir  # noqa: E402
from trtllm_kit.runtime.config import EngineConfig  # noqa: E402
from trtllm_kit.runtime.draft_model import DraftModel, draft_config  # noqa: E402
from trtllm_kit.runtime.executor import Executor  # noqa: E402
from trtllm_kit.runtime.model import CheckpointModel  # noqa: E402
from trtllm_kit.runtime.prompt_lookup import PromptLookup  # noqa: E402
from trtllm_kit.runtime.sequence import SamplingParams  # noqa: E402
from trtllm_kit.runtime.speculation import Speculator  # noqa: E402

MODEL = "smollm2-135m-instruct"
CODE = '''def moving_average(values, window):
    """The mean of each run of `window` consecutive values."""
    if window <= 0:
        raise ValueError("window must be positive")
    averages = []
    total = 0.0
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        if index >= window - 1:
            averages.append(total / window)
    return averages
'''
REQUEST = f"Rewrite this code with one change: rename the variable `total` to `running_sum`.\n\n{CODE}"


@dataclass
class Figures:
    run: str
    concurrency: int
    output_tokens: int
    wall_s: float
    cpu_s: float
    tokens_per_s: float
    acceptance_length: float
    same_output: bool
    load_average: float


def prompt_ids(model_dir: Path) -> list[int]:
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    text = tokenizer.apply_chat_template([{"role": "user", "content": REQUEST}], add_generation_prompt=True,
                                         tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def truncated(model_dir: Path, num_layers: int, out: Path) -> Path:
    """The model's first ``num_layers`` layers with its embedding, final norm and head: a draft sharing the
    tokenizer."""
    config = json.loads((model_dir / "config.json").read_text())
    config["num_hidden_layers"] = num_layers
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config))
    tensors = {name: t for name, t in load_file(str(model_dir / "model.safetensors")).items()
               if not name.startswith("model.layers.") or int(name.split(".")[2]) < num_layers}
    save_file(tensors, str(out / "model.safetensors"))
    return out


def run(name: str, model: CheckpointModel, config: EngineConfig, speculator: Speculator | None, prompt: list[int],
        max_tokens: int, concurrency: int) -> tuple[Figures, list[list[int]]]:
    params = [SamplingParams(max_tokens=max_tokens) for _ in range(concurrency)]
    Executor(model, config, speculator).generate([prompt], [SamplingParams(max_tokens=8)])  # warm-up, untimed
    if speculator is not None:
        speculator.counts = type(speculator.counts)()
    engine = Executor(model, config, speculator)
    start, cpu_start = time.perf_counter(), time.process_time()
    outputs = engine.generate([prompt] * concurrency, params)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    tokens = sum(len(o) for o in outputs)
    acceptance = speculator.counts.acceptance_length if speculator is not None else 1.0
    return Figures(name, concurrency, tokens, round(wall, 2), round(cpu, 2), round(tokens / wall, 1),
                   round(acceptance, 2), True, os.getloadavg()[0]), outputs


def main(argv: list[str] | None = None) -> list[Figures]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--max-draft-len", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--draft-layers", type=int, default=6)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model_dir = builtin_dir(MODEL)
    model, prompt = load_unified(model_dir), prompt_ids(model_dir)
    config = EngineConfig(max_batch_size=max(args.concurrency, 1), max_num_tokens=2048, tokens_per_block=32,
                          max_tokens_in_paged_kv_cache=args.concurrency * 2048)
    results: list[Figures] = []

    def report(figures: Figures) -> None:
        results.append(figures)
        if args.json:
            print(json.dumps(asdict(figures)), flush=True)
            return
        print(f"{figures.run:>24}: {figures.tokens_per_s:7.1f} tok/s  {figures.output_tokens} tokens in "
              f"{figures.wall_s:.2f} s ({figures.cpu_s:.2f} CPU s)  acceptance length {figures.acceptance_length:.2f}"
              f"  speedup {figures.tokens_per_s / results[0].tokens_per_s:.2f}x  same output {figures.same_output}  "
              f"load {figures.load_average:.1f}", flush=True)

    base, reference = run("off", model, config, None, prompt, args.max_tokens, args.concurrency)
    report(base)
    ngram = Speculator(PromptLookup(), args.max_draft_len)
    figures, outputs = run("ngram", model, config, ngram, prompt, args.max_tokens, args.concurrency)
    figures.same_output = outputs == reference
    report(figures)
    if args.draft_layers:
        with tempfile.TemporaryDirectory() as tmp:
            draft_dir = truncated(model_dir, args.draft_layers, Path(tmp) / "draft")
            for name in ("tokenizer.json", "tokenizer_config.json"):
                if (model_dir / name).exists():
                    (draft_dir / name).write_bytes((model_dir / name).read_bytes())
            draft = DraftModel(load_unified(draft_dir), draft_config(config, args.max_draft_len),
                               model.dims.vocab_size)
            figures, outputs = run(f"draft-target ({args.draft_layers} layers)", model, config,
                                   Speculator(draft, args.max_draft_len), prompt, args.max_tokens, args.concurrency)
            figures.same_output = outputs == reference
            report(figures)
    return results


if __name__ == "__main__":
    main()
