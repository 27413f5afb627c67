"""Two priority classes at overload on a served tiny Llama (cpu build, 4 batch slots): time to first token of each.

    python benchmarks/priority.py [--lows 12] [--low-tokens 480] [--highs 8] [--seed 0]

Builds ``builtin:tiny-llama`` for the cpu target with ``--max-batch-size 4`` and serves it on free loopback ports.
Then, twice (the high class sent with priority -10, then with the low class's priority 10): ``--lows`` streamed
token-id completions of 16 prompt tokens and ``--low-tokens`` new ones, and one second later ``--highs`` of 4 new
tokens, 0.1 s apart. Prints the high class's p99 and the low class's p50 and max time to first token, in seconds,
per run, with the load average. ``tests/serve/test_priority_serving.py`` checks the order the same scheduling
gives, whatever the load.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlparse

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from served import served_build

MODEL = "builtin:tiny-llama"


def ttft(port: int, prompt: list[int], max_tokens: int, priority: int) -> float:
    """Seconds from sending a streamed token-id completion to its first token; reads the stream to its end."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "priority": priority}
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    started, first = time.perf_counter(), None
    connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    if response.status != 200:
        raise SystemExit(f"the server answered {response.status}: {response.read()[:200]!r}")
    for line in response:
        if line.startswith(b"data: {") and first is None and json.loads(line[6:])["choices"][0].get("token_ids"):
            first = time.perf_counter() - started
    connection.close()
    if first is None:
        raise SystemExit("a stream ended without a token")
    return first


def overload(port: int, lows: int, low_tokens: int, highs: int, high_priority: int,
             seed: int) -> tuple[list[float], list[float]]:
    """The TTFTs of the high and the low class of one overload."""
    g = np.random.default_rng(seed)
    with ThreadPoolExecutor(lows + highs) as pool:
        low = [pool.submit(ttft, port, g.integers(0, 1000, 16).tolist(), low_tokens, 10) for _ in range(lows)]
        time.sleep(1.0)  # the four slots are busy and the rest of the low class waits
        high = []
        for _ in range(highs):
            high.append(pool.submit(ttft, port, g.integers(0, 1000, 16).tolist(), 4, high_priority))
            time.sleep(0.1)
        return [f.result() for f in high], [f.result() for f in low]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lows", type=int, default=12)
    parser.add_argument("--low-tokens", type=int, default=480, help="enough to keep the slots busy past the highs")
    parser.add_argument("--highs", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, served_build(MODEL, Path(tmp) / "out", "--max-batch-size", "4") as url:
        port = urlparse(url).port
        assert port is not None
        for label, priority in (("priorities -10 and 10", -10), ("equal priorities", 10)):
            high, low = overload(port, args.lows, args.low_tokens, args.highs, priority, args.seed)
            print(f"{label}: high p99 TTFT {np.percentile(high, 99):.3f} s, low p50 TTFT "
                  f"{np.percentile(low, 50):.3f} s, low max {max(low):.3f} s (load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
