"""The CPU runtime's speed beside transformers, side by side in one run, on the real model and the tiny one.

    python benchmarks/cpu_runtime.py [--quick] [--models smollm2-135m-instruct,tiny-llama] [--no-served]
                                     [--threads N] [--served-threads N] [--rounds 3] [--json]
    python benchmarks/cpu_runtime.py --profile [--quick] [--models smollm2-135m-instruct]
    python benchmarks/cpu_runtime.py --cpu-by-process [--quick] [--models smollm2-135m-instruct] [--rounds 3]

For each model (float32, greedy, every answer forced to its full length with ``ignore_eos``), two cases:

* batch 1: one chat prompt, 128 new tokens (``--quick``: 32);
* 8 concurrent: eight chat prompts, 64 new tokens each (``--quick``: 16).

Each case runs on three engines, each after an untimed warm-up, in ``--rounds`` rounds that run every engine once
in turn (so that they meet the same load); the median of the rounds is printed:

* transformers: ``generate`` on a left-padded batch;
* executor: the kit's ``Executor`` over the converted checkpoint (one per case, as a server keeps its pool), all
  requests queued at once;
* served: ``trtllm-kit serve`` of a cpu build (its own processes on the same cores), the OpenAI chat API, the
  requests sent at once from a thread each.

transformers and the executor compute with ``--threads`` torch threads (default: torch's count, the machine's
cores). The served model computes with its own default counts (``cpu_threads`` unset: torch's count for a step of
several rows, one fewer for a step of one row, ``runtime/threads.py``), or with ``--served-threads``, else
``--threads``, when given, at every step: it reads that count from ``OMP_NUM_THREADS`` in the serve's environment.

Prints one line per case with output tokens/s and the kit's ratios to transformers. The machine's load average is
printed with them: ratios taken in the same run stay comparable when other processes share the cores.

``--profile`` serves the first model alone and samples every process of the serve (tritonserver's Python stubs,
the OpenAI frontend) with ``py-spy record --subprocesses`` while the 8 concurrent requests run; it prints each part
of a step's share of the busy samples (counts, not seconds: they hold under load), the first category any frame
of a stack matches (``CATEGORIES``).

``--cpu-by-process`` serves the first model and prints the CPU milliseconds per generated token of each process of
the serve (the serve with its OpenAI frontend, tritonserver, each Python stub) over ``--rounds`` batch-1 chats, each
less its idle rate (``process_cpu.py``), beside the executor's own in this process and the client's: CPU time, not
wall time, so the figures hold on a loaded machine; then both runs' wall-clock tokens/s, which they do not (waits
for another process are wall time without CPU).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from process_cpu import by_process, serve_processes  # noqa: E402
from served import served_build  # noqa: E402

from trtllm_kit.checkpoint.convert import convert_checkpoint  # noqa: E402
from trtllm_kit.models.builtin import builtin_dir  # noqa: E402
from trtllm_kit.runtime.config import EngineConfig  # noqa: E402
from trtllm_kit.runtime.executor import Executor  # noqa: E402
from trtllm_kit.runtime.model import CheckpointModel  # noqa: E402
from trtllm_kit.runtime.sequence import SamplingParams  # noqa: E402
from trtllm_kit.runtime.threads import default_threads  # noqa: E402
from trtllm_kit.serve.server.state import serving_pid  # noqa: E402

MODELS = ("smollm2-135m-instruct", "tiny-llama")
QUESTIONS = ("What is the capital of France?", "Name three primary colors.", "Write one sentence about the sea.",
             "Who wrote Romeo and Juliet?", "What do bees make?", "Why do we need sleep?",
             "What is the largest planet in our solar system?", "Suggest a name for a pet goldfish.")

CATEGORIES = (  # a step's parts, each by substrings of a py-spy frame; a stack goes to the first that matches
    ("attention over paged blocks", ("attend (", "_group (")),
    ("sampling and logits processing", ("runtime/sampling.py", "runtime/penalties.py", "runtime/logprobs.py")),
    ("scheduler and block manager", ("runtime/scheduler.py", "runtime/block_manager.py", "runtime/sequence.py")),
    ("forward (linears, norms, rotary, lm_head)", ("runtime/model.py", "runtime/layers.py", "runtime/executor.py")),
    ("engine loop", ("runtime/loop.py", "runtime/handle.py", "runtime/response.py")),
    ("detokenization", ("detoken", "decode (tokenizers", "tokenization_utils", "text_tokenizer")),
    ("Triton I/O (stubs, tensors, BLS)", ("triton_models/", "pb_utils", "c_python_backend_utils")),
    ("frontend (HTTP, OpenAI)", ("serve/", "uvicorn", "starlette", "fastapi", "httptools", "h11", "asyncio")),
)


@dataclass
class Case:
    """One model and batch shape: output tokens/s of each engine (0: not run) and the kit's ratios."""

    model: str
    num_requests: int
    max_tokens: int
    transformers: float
    executor: float
    served: float
    load_average: float
    threads: int
    served_threads: str

    def line(self) -> str:
        def ratio(value: float) -> str:
            return f"{value / self.transformers:.2f}x" if value else "-"
        return (f"{self.model:24s} {self.num_requests} x {self.max_tokens:3d} tokens: transformers "
                f"{self.transformers:6.1f} tok/s | executor {self.executor:6.1f} tok/s ({ratio(self.executor)}) | "
                f"served {self.served:6.1f} tok/s ({ratio(self.served)}) | {self.threads} threads each"
                f"{'' if self.served_threads == str(self.threads) else f' (served {self.served_threads})'} | "
                f"load {self.load_average:.1f}")


def tokens_per_second(run: Callable[[], int]) -> float:
    """Output tokens/s of one call of ``run`` (which returns the tokens it made)."""
    start = time.perf_counter()
    tokens = run()
    return tokens / (time.perf_counter() - start)


def interleaved(runs: list[Callable[[], int] | None], rounds: int) -> list[float]:
    """The median tokens/s of each run (0 for None) over ``rounds`` rounds that call every run once in turn, after
    one untimed warm-up call each: the engines meet the same load."""
    for run in runs:
        if run is not None:
            run()
    samples: list[list[float]] = [[] for _ in runs]
    for _ in range(rounds):
        for run, figures in zip(runs, samples, strict=True):
            figures.append(tokens_per_second(run) if run is not None else 0.0)
    return [statistics.median(figures) for figures in samples]


def chat_ids(tokenizer: Any, num_requests: int) -> list[list[int]]:
    """The chat prompts' token ids (the template with its generation prompt)."""
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                          tokenize=True, return_dict=True)["input_ids"]
            for q in QUESTIONS[:num_requests]]


def transformers_run(model: Any, tokenizer: Any, prompts: list[list[int]], max_tokens: int) -> Callable[[], int]:
    """``generate`` of a left-padded batch of ``prompts``, greedy, exactly ``max_tokens`` new tokens each."""
    width = max(map(len, prompts))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])

    def run() -> int:
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                                 do_sample=False, pad_token_id=pad)
        return (out.shape[1] - width) * len(prompts)
    return run


def executor_run(model: CheckpointModel, prompts: list[list[int]], max_tokens: int) -> Callable[[], int]:
    """The kit's ``Executor`` on all ``prompts`` at once, greedy, exactly ``max_tokens`` new tokens each (no prefix
    reuse between calls: each computes its prompts)."""
    executor = Executor(model, EngineConfig(max_batch_size=len(prompts), enable_kv_cache_reuse=False))

    def run() -> int:
        outputs = executor.generate(prompts, [SamplingParams(max_tokens=max_tokens, ignore_eos=True)] * len(prompts))
        return sum(map(len, outputs))
    return run


def served_run(base_url: str, num_requests: int, max_tokens: int) -> Callable[[], int]:
    """``num_requests`` chat requests sent at once to the OpenAI frontend, greedy, ``max_tokens`` tokens each."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="unused", timeout=600)
    name = client.models.list().data[0].id

    def one(question: str) -> int:
        reply = client.chat.completions.create(model=name, messages=[{"role": "user", "content": question}],
                                               max_tokens=max_tokens, temperature=0.0,
                                               extra_body={"ignore_eos": True})
        assert reply.usage is not None
        return reply.usage.completion_tokens

    def run() -> int:
        with ThreadPoolExecutor(num_requests) as pool:
            return sum(pool.map(one, QUESTIONS[:num_requests]))
    return run


def measure(name: str, shapes: list[tuple[int, int]], with_served: bool, rounds: int, work: Path,
            served_threads: str) -> list[Case]:
    """Every shape (requests, tokens) of model ``name`` on the three engines, interleaved (``served_threads``: the
    served model's torch threads, for the figures' line)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf_dir = builtin_dir(name)
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    hf_model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    convert_checkpoint(hf_dir, work / name / "ckpt", dtype="float32")
    kit_model = CheckpointModel.load(work / name / "ckpt")
    serving = served_build(f"builtin:{name}", work / name / "out", "--dtype", "float32") if with_served else None
    cases = []
    with serving or contextlib.nullcontext() as base_url:
        for num_requests, max_tokens in shapes:
            prompts = chat_ids(tokenizer, num_requests)
            hf, ex, sv = interleaved([transformers_run(hf_model, tokenizer, prompts, max_tokens),
                                   executor_run(kit_model, prompts, max_tokens),
                                   served_run(base_url, num_requests, max_tokens) if base_url else None], rounds)
            cases.append(Case(name, num_requests, max_tokens, hf, ex, sv, os.getloadavg()[0],
                              torch.get_num_threads(), served_threads))
    return cases


def category(stack: str) -> str:
    """The part of a step a py-spy stack (frames joined by ``;``) belongs to."""
    return next((name for name, marks in CATEGORIES if any(m in stack for m in marks)), "other")


def profile(name: str, num_requests: int, max_tokens: int, work: Path) -> dict[str, int]:
    """Busy py-spy samples per category of every process of a serve of ``name`` during ``num_requests``
    concurrent chats of ``max_tokens`` tokens (after an untimed warm-up)."""
    raw = work / "profile.raw"
    with served_build(f"builtin:{name}", work / name / "out", "--dtype", "float32") as base_url:
        run = served_run(base_url, num_requests, max_tokens)
        run()  # warm-up
        pid = serving_pid(work / name / "out")
        assert pid is not None, f"no serve of {name} is running"
        spy = subprocess.Popen(["py-spy", "record", "--subprocesses", "--nonblocking", "--rate", "200", "--format",
                                "raw", "--output", str(raw), "--pid", str(pid)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
        time.sleep(2.0)  # py-spy attaches to every process first
        run()
        spy.send_signal(signal.SIGINT)
        _, errors = spy.communicate(timeout=120)
    if not raw.is_file():
        raise SystemExit(f"py-spy wrote no profile (exit {spy.returncode}): {errors.strip()[-500:]}")
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        counts[category(stack)] += int(count)
    return dict(counts)


def cpu_by_process(name: str, max_tokens: int, rounds: int, work: Path) -> list[tuple[str, float, str]]:
    """CPU ms per generated token of each process of a serve of ``name`` over ``rounds`` batch-1 chats of
    ``max_tokens`` tokens (after an untimed warm-up), then of this process's client and of the executor alone, and
    the wall-clock tokens/s of both (which waits and the machine's load move): rows of (part, figure, unit).

    Arguments:
        name: a built-in model; max_tokens: tokens per chat; rounds: chats measured; work: a scratch directory.
    """
    with served_build(f"builtin:{name}", work / name / "out", "--dtype", "float32") as base_url:
        one = served_run(base_url, 1, max_tokens)
        one()  # warm-up
        pid = serving_pid(work / name / "out")
        assert pid is not None, f"no serve of {name} is running"
        client_start = time.process_time()

        wall: list[float] = []

        def run() -> int:
            start = time.perf_counter()
            num_tokens = sum(one() for _ in range(rounds))
            wall.append(num_tokens / (time.perf_counter() - start))
            return num_tokens
        rows = [(f"{p.name} [{p.pid}]", p.ms_per_token, "CPU ms/token")
                for p in by_process(serve_processes(pid), run, idle_s=10.0)]
        client_ms = 1000 * (time.process_time() - client_start) / (rounds * max_tokens)
    from transformers import AutoTokenizer

    hf_dir = builtin_dir(name)
    convert_checkpoint(hf_dir, work / name / "ckpt", dtype="float32")
    executor = executor_run(CheckpointModel.load(work / name / "ckpt"), chat_ids(AutoTokenizer.from_pretrained(hf_dir),
                                                                              1), max_tokens)
    executor()  # warm-up
    start, start_wall = time.process_time(), time.perf_counter()
    num_tokens = sum(executor() for _ in range(rounds))
    executor_ms = 1000 * (time.process_time() - start) / num_tokens
    executor_tps = num_tokens / (time.perf_counter() - start_wall)
    return [*rows, ("client (this process, openai)", client_ms, "CPU ms/token"),
            ("executor alone (this process)", executor_ms, "CPU ms/token"),
            ("served chats, wall clock", wall[0], "tokens/s"), ("executor alone, wall clock", executor_tps, "tokens/s")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="32 tokens at batch 1 and 16 at 8 concurrent")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated built-in model names")
    parser.add_argument("--no-served", action="store_true", help="transformers and the executor only")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads of transformers, the executor and the served model (default: torch's "
                             "count; the served model's own default)")
    parser.add_argument("--served-threads", type=int, default=None,
                        help="the served model's torch threads when not --threads")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (each engine once a round; median)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--profile", action="store_true", help="the served path's busy samples by part (py-spy)")
    parser.add_argument("--cpu-by-process", action="store_true",
                        help="CPU ms per generated token of each serve process at batch 1, and the executor's")
    args = parser.parse_args()
    if not args.no_served and importlib.util.find_spec("openai") is None:
        raise SystemExit("the served engine is measured through the openai client, which is not installed; run pip "
                         "install -c constraints.txt -e '.[test]', or pass --no-served.")
    torch.manual_seed(0)
    served = args.served_threads or args.threads  # None: the served model's own default
    own = default_threads(environ={})
    served_threads = str(served) if served else f"{own.one_row} at one row, {own.several_rows} at more"
    args.threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(args.threads)
    if served:  # read by the served model (its cpu_threads unset): every step at that count
        os.environ["OMP_NUM_THREADS"] = str(served)
    else:
        os.environ.pop("OMP_NUM_THREADS", None)
    shapes = [(1, 32), (8, 16)] if args.quick else [(1, 128), (8, 64)]
    cases: list[Case] = []
    if args.cpu_by_process:
        name, max_tokens = args.models.split(",")[0], shapes[0][1]
        with tempfile.TemporaryDirectory() as tmp:
            rows = cpu_by_process(name, max_tokens, args.rounds, Path(tmp))
        print(f"{name}, batch 1 x {max_tokens} tokens x {args.rounds} chats, {args.threads} threads, "
              f"load {os.getloadavg()[0]:.1f}")
        for label, figure, unit in rows:
            print(f"{figure:8.2f} {unit:12s}  {label}")
        return
    if args.profile:
        with tempfile.TemporaryDirectory() as tmp:
            counts = profile(args.models.split(",")[0], *shapes[1], Path(tmp))
        total = sum(counts.values())
        for part, count in sorted(counts.items(), key=lambda item: -item[1]):
            print(f"{count / total:6.1%} {count:7d} samples  {part}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            cases += measure(name, shapes, not args.no_served, args.rounds, Path(tmp), served_threads)
    if args.json:
        print(json.dumps([asdict(c) for c in cases], indent=2))
    else:
        print("\n".join(c.line() for c in cases))


if __name__ == "__main__":
    main()
