"""The served model's tokens/s at several torch thread counts: one serve of the same cpu build per count, answering
in turns (the default of ``cpu_threads``, ``runtime/threads.RESERVED_CORES``, is set from these).

    python benchmarks/served_threads.py [--model smollm2-135m-instruct] [--threads 1,2,default] [--rounds 4]

Each serve reads its count from ``OMP_NUM_THREADS`` in its environment and computes every step with it; ``default`` is
a serve whose environment sets none, at the served model's own counts per step (``runtime/threads.py``). Each case
(batch 1 × 128 new tokens, 8 concurrent × 64, greedy, ``ignore_eos``) runs every serve once a round after an untimed
warm-up call each, in ``--rounds`` rounds; the median of each serve's rounds is printed with the machine's load
average.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
from pathlib import Path

from cpu_runtime import interleaved, served_run  # beside this file: its directory is on the path
from served import served_build

CASES = ((1, 128), (8, 64))  # (concurrent requests, new tokens each)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a built-in model name")
    parser.add_argument("--threads", default="1,2,default",
                        help="comma-separated torch thread counts (or default), one serve each")
    parser.add_argument("--rounds", type=int, default=4, help="timed rounds (each serve once a round; median)")
    args = parser.parse_args()
    counts = args.threads.split(",")
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as serves:
        urls = []
        for count in counts:
            if count == "default":
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = str(int(count))  # the serve's environment: its cpu_threads default
            urls.append(serves.enter_context(served_build(f"builtin:{args.model}", Path(tmp) / f"threads{count}",
                                                          "--dtype", "float32")))
        for num_requests, max_tokens in CASES:
            figures = interleaved([served_run(url, num_requests, max_tokens) for url in urls], args.rounds)
            print(f"{args.model} {num_requests} x {max_tokens} tokens: "
                  + " | ".join(f"{count} threads {tps:6.1f} tok/s" for count, tps in zip(counts, figures, strict=True))
                  + f" | load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
