"""The thread a model is loaded on, and the speed of the thread that then steps it.

    python benchmarks/load_thread.py [--model smollm2-135m-instruct] [--requests 8] [--tokens 64] [--rounds 2]

A server of the CPU runtime steps its model on the engine loop's thread. Three ways of loading it, each in a
process of its own at torch's thread count (the machine's cores), the model's ``Executor`` then running
``--requests`` chat prompts of ``--tokens`` new tokens each (greedy, full length), ``--rounds`` times after a
warm-up:

* ``same``: loaded and stepped on the main thread (as the in-process benchmarks do);
* ``main``: loaded on the main thread, stepped on another (as the servers did);
* ``passing``: loaded on a thread that ends (``runtime/threads.on_passing_thread``), stepped on another (as the
  servers do).

Prints each way's tokens/s and the native threads the process holds beside its Python threads (libgomp's workers
among them): libgomp keeps a pool of workers for each thread that has run a parallel operation, and once a process
holds more of them than the machine has cores, its idle workers sleep between operations instead of spinning.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WAYS = ("same", "main", "passing")


def native_threads() -> int:
    """This process's threads less its Python threads."""
    return len(os.listdir("/proc/self/task")) - threading.active_count()


def one_way(way: str, model: str, num_requests: int, max_tokens: int, rounds: int) -> None:
    """Load ``model`` and step it the ``way`` says; print the tokens/s of each round and the native threads."""
    from cpu_runtime import chat_ids, executor_run, tokens_per_second
    from transformers import AutoTokenizer

    from trtllm_kit.checkpoint.convert import convert_checkpoint
    from trtllm_kit.models.builtin import builtin_dir
    from trtllm_kit.runtime.model import CheckpointModel
    from trtllm_kit.runtime.threads import on_passing_thread

    hf_dir = builtin_dir(model)
    prompts = chat_ids(AutoTokenizer.from_pretrained(hf_dir), num_requests)
    with tempfile.TemporaryDirectory() as tmp:
        # apart in every way: the conversion's own pool would otherwise stay on this thread
        on_passing_thread(lambda: convert_checkpoint(hf_dir, Path(tmp) / "ckpt", dtype="float32"))

        def load() -> Callable[[], int]:
            return executor_run(CheckpointModel.load(Path(tmp) / "ckpt"), prompts, max_tokens)
        run = load() if way in ("same", "main") else on_passing_thread(load)
        figures: list[float] = []

        def step() -> None:
            run()  # warm-up
            figures.extend(tokens_per_second(run) for _ in range(rounds))
        if way == "same":
            step()
        else:
            stepping = threading.Thread(target=step)
            stepping.start()
            stepping.join()
    print(f"{way:8s} {' '.join(f'{f:6.1f}' for f in figures)} tokens/s | {native_threads()} native threads | "
          f"load {os.getloadavg()[0]:.1f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a built-in model")
    parser.add_argument("--requests", type=int, default=8, help="chat prompts run together")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens each")
    parser.add_argument("--rounds", type=int, default=2, help="timed runs after a warm-up")
    parser.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)  # one way, in a process of its own
    args = parser.parse_args()
    if args.way:
        one_way(args.way, args.model, args.requests, args.tokens, args.rounds)
        return
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    print(f"{args.model}, {args.requests} x {args.tokens} tokens, torch's threads, {args.rounds} rounds each")
    for way in WAYS:
        subprocess.run([sys.executable, __file__, "--way", way, "--model", args.model, "--requests",
                        str(args.requests), "--tokens", str(args.tokens), "--rounds", str(args.rounds)],
                       env=env, check=True, stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
