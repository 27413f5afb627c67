"""Soak: minutes of mixed load on the OpenAI frontend of the tiny model, with disconnects and bad requests.

Builds ``builtin:tiny-llama`` (or takes ``--out``), serves it with ``trtllm-kit serve --detach`` and runs
``--workers`` clients for ``--minutes``. Each request is drawn (fixed seed) from: a whole completion, a streamed
one, a stream the client drops after a few events, a request the client drops before any answer, and faulty
bodies (non-UTF-8, a lone surrogate, deep nesting, ``max_tokens`` beyond ``max_seq_len``, ``"stream": "false"``).
It prints one line of figures: requests served, errors by kind, requests lost (sent, not dropped by the client,
and never answered within 120 s: must be 0), the engine's sequence-steps spent after disconnects (scheduled
sequence-steps minus the prompts and tokens clients received), and the RSS of every server process at start and
end.

    python benchmarks/soak.py --minutes 10 [--json]

``--kinds drop-stream,whole`` runs only some kinds of request (to find which one a fault follows); ``--keep-log
FILE`` copies tritonserver's log there at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from prometheus_client.parser import text_string_to_metric_families

from trtllm_kit.serve.server.launcher import free_endpoints, free_port
from trtllm_kit.serve.server.state import read_state, run_dir

KIT = [sys.executable, "-m", "trtllm_kit"]
MODEL = "builtin:tiny-llama"
FAULTS = [b'{"model": "builtin:tiny-llama", "prompt": "\xff\xfe"}',
          b'{"model": "builtin:tiny-llama", "prompt": "\\ud800"}',
          b'{"model": "builtin:tiny-llama", "prompt": ' + b"[" * 50_000 + b"}",
          b'{"model": "builtin:tiny-llama", "prompt": "hi", "max_tokens": 5000}',
          b'{"model": "builtin:tiny-llama", "prompt": "hi", "stream": "false"}']
KINDS = ("whole", "stream", "drop-stream", "drop-early", "fault")
WEIGHTS = (3, 3, 2, 1, 1)


@dataclass
class SoakResult:
    """The figures of one soak."""

    minutes: float
    workers: int
    sent: int = 0
    served: int = 0
    dropped_by_client: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    tokens_received: int = 0
    engine_sequence_steps: float = 0.0
    wasted_after_disconnects: float = 0.0
    rss_mb_start: dict[str, float] = field(default_factory=dict)
    rss_mb_end: dict[str, float] = field(default_factory=dict)
    serve_alive_at_end: bool = False
    server_died_after_s: float | None = None  # the load of one server stops when its serve is gone
    examples: dict[str, str] = field(default_factory=dict)  # the first message of each kind of error
    crashes: list[dict[str, Any]] = field(default_factory=list)  # each death: seconds into the soak, and how


def engine_counters(metrics: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as response:
        text = response.read().decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if family.name == "trtllm_kit_batch_metrics" and sample.labels["batch_metric"] == \
                    "total_scheduled_requests":
                found["sequence_steps"] = sample.value
            if family.name == "nv_trt_llm_request_metrics" and sample.labels["request_type"] == "active":
                found["active"] = sample.value
    return found


def rss(state: dict[str, Any]) -> dict[str, float]:
    """RSS in MB of serve, tritonserver and every stub (by model)."""
    pids = {"serve": state["pid"], "tritonserver": state["server_pid"],
            **{f"stub:{name}": int(pid) for pid, name in state.get("stubs", {}).items()}}
    out = {}
    for name, pid in pids.items():
        try:
            out[name] = round(psutil.Process(pid).memory_info().rss / 2**20, 1)
        except psutil.Error:
            out[name] = 0.0
    return out


async def one(session: aiohttp.ClientSession, url: str, kind: str, rng: random.Random,
              result: SoakResult) -> None:
    result.sent += 1
    body: bytes
    if kind == "fault":
        body = rng.choice(FAULTS)
    else:
        words = ("the", "a", "cat", "sat", "on", "mat", "and")
        prompt = " ".join(rng.choice(words) for _ in range(rng.randint(2, 30)))
        usage = {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": rng.randint(4, 64), "temperature": 0,
                           "ignore_eos": True, "stream": kind != "whole",
                           **({} if kind == "whole" else usage)}).encode()
    timeout = aiohttp.ClientTimeout(total=120)
    try:
        if kind == "drop-early":
            task = asyncio.create_task(session.post(url, data=body, timeout=timeout))
            await asyncio.sleep(rng.uniform(0.0, 0.3))
            task.cancel()
            try:
                response = await task
                response.close()
            except asyncio.CancelledError:
                pass
            result.dropped_by_client += 1
            return
        async with session.post(url, data=body, timeout=timeout) as response:
            if response.status != 200:
                payload = await response.json(content_type=None)
                key = f"{response.status} {payload['error'].get('code') or payload['error']['type']}"
                result.errors[key] = result.errors.get(key, 0) + 1
                result.examples.setdefault(key, str(payload["error"].get("message"))[:160])
                return
            if kind == "whole":
                payload = await response.json()
                result.tokens_received += payload["usage"]["completion_tokens"]
                result.served += 1
                return
            events, tokens, limit = 0, 0, rng.randint(1, 5) if kind == "drop-stream" else None
            async for line in response.content:
                if not line.startswith(b"data: "):
                    continue
                if line.startswith(b"data: [DONE]"):
                    result.served += 1
                    result.tokens_received += tokens
                    return
                if b'"error"' in line:
                    key = "stream error"
                    result.errors[key] = result.errors.get(key, 0) + 1
                    result.examples.setdefault(key, line[6:166].decode(errors="replace"))
                    return
                events += 1
                tokens = (json.loads(line[6:]).get("usage") or {}).get("completion_tokens", tokens)
                if limit is not None and events >= limit:
                    result.tokens_received += tokens
                    result.dropped_by_client += 1
                    response.close()  # the client leaves
                    return
            result.lost += 1  # the stream ended without [DONE] or an error
    except (TimeoutError, asyncio.TimeoutError):
        result.lost += 1
    except aiohttp.ClientError as exc:
        key = f"connection {type(exc).__name__}"
        result.errors[key] = result.errors.get(key, 0) + 1


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


async def load(openai: str, minutes: float, workers: int, seed: int, result: SoakResult,
               kinds: tuple[str, ...] = KINDS, serve_pid: int | None = None) -> None:
    url = f"http://{openai}/v1/completions"
    started = time.monotonic()
    deadline = started + minutes * 60

    async def watch() -> None:
        while serve_pid is not None and time.monotonic() < deadline:
            if gone(serve_pid):
                result.server_died_after_s = round(time.monotonic() - started, 1)
                return
            await asyncio.sleep(0.5)
    weights = [WEIGHTS[KINDS.index(k)] for k in kinds]

    async def worker(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline and result.server_died_after_s is None:
                await one(session, url, rng.choices(kinds, weights)[0], rng, result)

    await asyncio.gather(watch(), *(worker(i) for i in range(workers)))


def start_serve(out: Path) -> dict[str, Any]:
    """``serve --detach`` on free ports; its state (pids, addresses)."""
    ep, openai_port = free_endpoints(), free_port()
    started = subprocess.run([*KIT, "serve", str(out), "--http-port", str(ep.http_port), "--grpc-port",
                              str(ep.grpc_port), "--metrics-port", str(ep.metrics_port), "--openai-port",
                              str(openai_port), "--detach"], capture_output=True, text=True)
    if started.returncode:
        sys.exit(f"serve failed (exit {started.returncode}): {started.stderr.strip()}")
    state = read_state(out)
    assert state is not None
    return state


def crash_signature(log: Path) -> str:
    """The line of tritonserver's log that says how it died (a signal, an uncaught C++ exception), if any."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return "no log"
    marks = ("Signal (", "terminate called", "what():", "Fatal Python error")
    found = [line.strip() for line in lines if line.startswith(marks) or line.strip().startswith("what():")]
    return "; ".join(found[:3]) or "no signal in the log"


def run_segment(out: Path, state: dict[str, Any], minutes: float, workers: int, seed: int, result: SoakResult,
                kinds: tuple[str, ...]) -> None:
    """Load one server until the deadline or its death; add its engine steps when it survived."""
    tokens0, answered0 = result.tokens_received, result.served + result.dropped_by_client
    before = engine_counters(state["metrics"])
    asyncio.run(load(state["openai"], minutes, workers, seed, result, kinds, state["pid"]))
    if result.server_died_after_s is not None:
        return
    try:
        while engine_counters(state["metrics"])["active"]:
            time.sleep(0.1)
        steps = engine_counters(state["metrics"])["sequence_steps"] - before["sequence_steps"]
    except OSError:  # it died (or hangs in its signal handler) after the load ended
        result.server_died_after_s = minutes * 60
        return
    answered = result.served + result.dropped_by_client - answered0  # each had one prompt (context) step
    result.engine_sequence_steps += steps
    result.wasted_after_disconnects += max(0.0, steps - (result.tokens_received - tokens0) - answered)


def main(argv: list[str] | None = None) -> SoakResult:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="a built artifact (default: build the tiny model)")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of {', '.join(KINDS)}")
    parser.add_argument("--keep-log", type=Path, help="copy tritonserver's log here at the end (of each crash, "
                                                      "as FILE.crashN)")
    parser.add_argument("--no-restart", action="store_true", help="end the soak when the server dies")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    kinds = tuple(args.kinds.split(","))
    if not set(kinds) <= set(KINDS):
        parser.error(f"--kinds takes {', '.join(KINDS)}")
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp) / "out"
        if args.out is None:
            subprocess.run([*KIT, "build", MODEL, "--no-verify", "--instances", "1", "--out", str(out)], check=True,
                           capture_output=True)
        state = start_serve(out)
        result = SoakResult(args.minutes, args.workers)
        try:
            asyncio.run(load(state["openai"], 0.05, 2, args.seed + 1, SoakResult(0, 0)))  # untimed warm-up
            result.rss_mb_start = rss(state)
            deadline = time.monotonic() + args.minutes * 60
            segment = 0
            while True:
                began = time.monotonic()
                run_segment(out, state, (deadline - began) / 60, args.workers, args.seed + segment, result, kinds)
                if result.server_died_after_s is None:
                    break
                log = run_dir(out) / "tritonserver.log"
                result.crashes.append({"after_s": round(began - deadline + args.minutes * 60
                                                        + result.server_died_after_s, 1),
                                       "how": crash_signature(log)})
                if args.keep_log is not None and log.exists():
                    shutil.copyfile(log, f"{args.keep_log}.crash{len(result.crashes)}")
                result.server_died_after_s = None
                subprocess.run([*KIT, "stop", str(out)], capture_output=True)
                if args.no_restart or time.monotonic() > deadline - 5:
                    break
                state = start_serve(out)  # as a supervisor restarts a serve that exited 1
                segment += 1
            result.serve_alive_at_end = not gone(state["pid"])
            result.rss_mb_end = rss(state)
        finally:
            if args.keep_log is not None and (run_dir(out) / "tritonserver.log").exists():
                shutil.copyfile(run_dir(out) / "tritonserver.log", args.keep_log)
            subprocess.run([*KIT, "stop", str(out)], capture_output=True)
    errors = ", ".join(f"{k}: {v}" for k, v in sorted(result.errors.items()))
    if args.json:
        print(json.dumps(asdict(result), indent=2))
    else:
        print(f"soak {result.minutes:g} min, {result.workers} workers: sent {result.sent}, served {result.served}, "
              f"dropped by the client {result.dropped_by_client}, errors {{{errors}}}, lost {result.lost}, "
              f"engine sequence-steps {result.engine_sequence_steps:.0f} of which after disconnects "
              f"{result.wasted_after_disconnects:.0f}, RSS MB start {result.rss_mb_start} end {result.rss_mb_end}, "
              f"serve alive at end {result.serve_alive_at_end}, server deaths {len(result.crashes)}"
              + "".join(f"\n  died after {c['after_s']} s: {c['how']}" for c in result.crashes)
              + "".join(f"\n  {k}: {v}" for k, v in sorted(result.examples.items())))
    return result


if __name__ == "__main__":
    main()
