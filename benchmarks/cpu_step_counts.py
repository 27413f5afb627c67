"""What one decode step does, counted rather than timed: the kit's executor beside transformers ``generate``.

    python benchmarks/cpu_step_counts.py [--models smollm2-135m-instruct,tiny-llama] [--batch 1] [--tokens 8]
        [--rounds 5] [--threads 1] [--json]

For each model (float32, ``--threads`` torch threads, greedy, the first ``--batch`` chat prompts of
``cpu_runtime.py``: B sequences decoding together, each one new token a step; transformers runs them as a
left-padded batch), each engine generates 1 and then ``1 + --tokens`` new tokens after an untimed warm-up; the
difference of the two calls, divided by ``--tokens``, is one decode step (the prompts' forward pass and the first
tokens cancel out). Counted per step:

* matrix products: the linears (``aten::mm``, ``aten::addmm``, and ``aten::addmm_``: a product added into the
  residual stream; ``mkldnn::_linear_pointwise``: the kit's product on packed weights from two rows up,
  ``runtime/products.py``) and attention's (``aten::bmm``) torch operations;
* operations: every torch operation the profiler records (nested ones included, as the dispatcher runs them);
* Python calls: function calls seen by ``sys.setprofile`` (Python functions, then C functions apart);
* the self-CPU milliseconds of the matrix products and of all operations (times: these move with the machine's load;
  the counts do not);
* the step's CPU time (``time.thread_time``, the median of ``--rounds`` pairs of calls): the time the thread ran,
  which other work on the machine moves far less than wall time (with ``--threads`` above 1, the calling thread's
  only), and its wall time (the same pairs: what more threads are for, and what the load moves).

Prints one line per model and engine with units, or ``--json``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cpu_runtime import chat_ids, transformers_run  # noqa: E402

from trtllm_kit.checkpoint.convert import convert_checkpoint  # noqa: E402
from trtllm_kit.models.builtin import builtin_dir  # noqa: E402
from trtllm_kit.runtime.config import EngineConfig  # noqa: E402
from trtllm_kit.runtime.executor import Executor  # noqa: E402
from trtllm_kit.runtime.model import CheckpointModel  # noqa: E402
from trtllm_kit.runtime.sequence import SamplingParams  # noqa: E402

MODELS = ("smollm2-135m-instruct", "tiny-llama")
LINEAR_PRODUCTS = ("aten::mm", "aten::addmm", "aten::addmm_", "mkldnn::_linear_pointwise")
ATTENTION_PRODUCTS = ("aten::bmm",)


@dataclass
class StepCounts:
    """One engine's decode step of ``batch`` sequences on one model: counts, and self-CPU milliseconds at the load
    said."""

    model: str
    engine: str
    batch: int
    linear_products: float
    attention_products: float
    operations: float
    python_calls: float
    c_calls: float
    matrix_ms: float
    total_ms: float
    cpu_ms: float
    wall_ms: float
    threads: int
    load_average: float

    def line(self) -> str:
        return (f"{self.model:24s} {self.engine:12s} batch {self.batch}: {self.linear_products:5.0f} linear products, "
                f"{self.attention_products:4.0f} attention products, {self.operations:6.0f} torch operations, "
                f"{self.python_calls:6.0f} Python calls + {self.c_calls:6.0f} C calls per step | self CPU "
                f"{self.matrix_ms:6.2f} ms in matrix products of {self.total_ms:6.2f} ms "
                f"({self.matrix_ms / self.total_ms:.0%}) | step CPU time {self.cpu_ms:6.2f} ms, wall "
                f"{self.wall_ms:7.2f} ms at {self.threads} threads | load {self.load_average:.1f}")


def python_calls(run: Callable[[], object]) -> tuple[int, int]:
    """Python function calls and C function calls made by one call of ``run``."""
    counts: collections.Counter[str] = collections.Counter()

    def count(frame: Any, event: str, arg: Any) -> None:
        counts[event] += 1
    sys.setprofile(count)
    try:
        run()
    finally:
        sys.setprofile(None)
    return counts["call"], counts["c_call"]


def operations(run: Callable[[], object]) -> dict[str, tuple[int, float]]:
    """Each torch operation's count and self-CPU milliseconds in one call of ``run``."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    return {e.key: (e.count, e.self_cpu_time_total / 1000) for e in prof.key_averages()}


def thread_and_wall_ms(run: Callable[[], object]) -> tuple[float, float]:
    """CPU milliseconds this thread spent in one call of ``run``, and the call's wall milliseconds."""
    started, wall = time.thread_time(), time.perf_counter()
    run()
    return (time.thread_time() - started) * 1000, (time.perf_counter() - wall) * 1000


def per_step(model: str, engine: str, batch: int, make: Callable[[int], Callable[[], object]], num_tokens: int,
             rounds: int) -> StepCounts:
    """The counts of ``make(1 + num_tokens)`` less those of ``make(1)``, divided by ``num_tokens``; the step's CPU
    time the median of ``rounds`` such differences."""
    short, long = make(1), make(1 + num_tokens)
    short()
    long()  # warm-up: first-call allocations and caches
    pairs = [(thread_and_wall_ms(long), thread_and_wall_ms(short)) for _ in range(rounds)]
    cpu_ms, wall_ms = (statistics.median((a[i] - b[i]) / num_tokens for a, b in pairs) for i in (0, 1))
    py = [python_calls(run) for run in (short, long)]
    ops = [operations(run) for run in (short, long)]

    def diff(names: tuple[str, ...] | None, field: int) -> float:
        total = [sum(v[field] for k, v in o.items() if names is None or k in names) for o in ops]
        return (total[1] - total[0]) / num_tokens
    return StepCounts(model, engine, batch, diff(LINEAR_PRODUCTS, 0), diff(ATTENTION_PRODUCTS, 0), diff(None, 0),
                      (py[1][0] - py[0][0]) / num_tokens, (py[1][1] - py[0][1]) / num_tokens,
                      diff(LINEAR_PRODUCTS + ATTENTION_PRODUCTS, 1), diff(None, 1), cpu_ms, wall_ms,
                      torch.get_num_threads(), os.getloadavg()[0])


def measure(name: str, batch: int, num_tokens: int, rounds: int, work: Path) -> list[StepCounts]:
    """Both engines' decode step of ``batch`` sequences on model ``name``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf_dir = builtin_dir(name)
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    hf_model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    convert_checkpoint(hf_dir, work / name, dtype="float32")
    executor = Executor(CheckpointModel.load(work / name),
                        EngineConfig(max_batch_size=batch, enable_kv_cache_reuse=False))
    prompts = chat_ids(tokenizer, batch)

    def executor_run(tokens: int) -> Callable[[], object]:
        params = [SamplingParams(max_tokens=tokens, ignore_eos=True)] * batch
        return lambda: executor.generate(prompts, params)
    return [per_step(name, "transformers", batch, lambda tokens: transformers_run(hf_model, tokenizer, prompts, tokens),
                     num_tokens, rounds),
            per_step(name, "executor", batch, executor_run, num_tokens, rounds)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated built-in model names")
    parser.add_argument("--batch", type=int, default=1, help="sequences decoding together (the chat prompts)")
    parser.add_argument("--tokens", type=int, default=8, help="decode steps counted (the difference of two calls)")
    parser.add_argument("--rounds", type=int, default=5, help="pairs of calls the step's CPU time is the median of")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of both engines")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        steps = [s for name in args.models.split(",")
                 for s in measure(name, args.batch, args.tokens, args.rounds, Path(tmp))]
    print(json.dumps([asdict(s) for s in steps], indent=2) if args.json else "\n".join(s.line() for s in steps))


if __name__ == "__main__":
    main()
