"""The frontends alone, measured here: Dynamo's OpenAI frontend and the kit's (the one ``serve --dynamo`` puts in
front of it) over a stub worker that answers at once, so the worker costs nothing and the latency is the
frontends' and their hops'.

    python benchmarks/dynamo_frontends.py [--sequential 200]

Builds ``builtin:tiny-llama`` for the CPU runtime (its tokenizer and model card), then starts on 127.0.0.1, each
in its own process: Dynamo's frontend (``launch.py``'s command line and environment, file discovery), a stub
worker registered as ``serve --dynamo``'s worker is (token ids in, one token id out at once), and the kit's frontend
for Dynamo (``serve/dynamo/gateway.py``). It sends ``--sequential`` non-streamed 1-token completions of one 6-token
prompt to each frontend, taking turns request by request after 10 untimed turns: A through Dynamo's frontend to the
stub, B through the kit's frontend, then Dynamo's, to the stub, then each streamed. A is Dynamo's
frontend's latency per request; B - A is the kit's frontend's. Prints one line of figures with units and the load
average before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict
from pathlib import Path
from typing import Any

from trtllm_kit.enums import Router
from trtllm_kit.serve.dynamo.card import write_card
from trtllm_kit.serve.dynamo.launch import ENDPOINT, LOOPBACK, DynamoDirs, dynamo_env, frontend_argv
from trtllm_kit.serve.dynamo.request import response_chunk
from trtllm_kit.serve.dynamo.run import lists_model
from trtllm_kit.serve.server.launcher import free_endpoints, free_port

PROMPT_IDS = [1, 264, 333, 84, 534, 332]
WARMUP = 10
MODEL = "stub"
ANSWER_ID = 29889  # the one token the stub answers with


async def stub_worker(card: Path) -> None:
    """A Dynamo worker answering every request with one token at once, until SIGTERM."""
    from dynamo.llm import ModelInput, ModelType, WorkerType, register_model
    from dynamo.runtime import DistributedRuntime

    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(loop, "file", "tcp")
    loop.add_signal_handler(signal.SIGTERM, runtime.shutdown)
    endpoint = runtime.endpoint(ENDPOINT)
    await register_model(ModelInput.Tokens, ModelType.Chat | ModelType.Completions, endpoint, str(card), MODEL,
                         worker_type=WorkerType.Aggregated, kv_cache_block_size=32)

    async def generate(request: dict[str, Any], context: Any) -> Any:  # Dynamo passes the context by this name
        yield response_chunk([ANSWER_ID], "length", len(request["token_ids"]), 1)

    await endpoint.serve_endpoint(generate, graceful_shutdown=False)


async def kit_frontend(out: Path, dynamo_url: str, port: int) -> None:
    """The kit's frontend of a ``--dynamo`` serve on ``port``, in front of ``dynamo_url``, until SIGTERM."""
    from trtllm_kit.serve.dynamo.gateway import dynamo_frontend
    from trtllm_kit.serve.frontend import start_frontend
    from trtllm_kit.serve.service import ServeOptions
    from trtllm_kit.spec import ServeSettings

    options = ServeOptions(out=out, settings=ServeSettings(**asdict(free_endpoints()), openai_port=port,
                                                           dynamo=True))
    runner = await start_frontend(dynamo_frontend(options, MODEL, dynamo_url), LOOPBACK, port)
    stopped = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopped.set)
    await stopped.wait()
    await runner.cleanup()


def completion_ms(url: str, stream: bool = False) -> float:
    """The time of one 1-token completion of ``PROMPT_IDS`` at ``url``, its answer read whole."""
    body = json.dumps({"model": MODEL, "prompt": PROMPT_IDS, "max_tokens": 1, "temperature": 0,
                       "stream": stream}).encode()
    request = urllib.request.Request(f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"})
    start = time.perf_counter_ns()
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            response.read()
    except urllib.error.HTTPError as exc:
        raise SystemExit(f"{url} answered {exc.code}: {exc.read()[:300]!r}") from None
    return (time.perf_counter_ns() - start) / 1e6


def interleaved_ms(paths: dict[str, tuple[str, bool]], count: int) -> dict[str, list[float]]:
    """Each path's times of ``count`` sequential completions, the paths taking turns request by request (A, B, C,
    A, B, C, ...) so that the machine's load weighs on each alike, after ``WARMUP`` untimed turns.

    Arguments:
        paths: name → (frontend url, streamed); count: timed completions per path.
    """
    times: dict[str, list[float]] = {name: [] for name in paths}
    for number in range(WARMUP + count):
        for name, (url, stream) in paths.items():
            elapsed = completion_ms(url, stream)
            if number >= WARMUP:
                times[name].append(elapsed)
    return times


def _wait(ready: Any, what: str, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise SystemExit(f"{what} was not ready within {timeout_s:g} s")
        time.sleep(0.2)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequential", type=int, default=200, help="Timed 1-token completions per path.")
    parser.add_argument("--stub-worker", type=Path, help=argparse.SUPPRESS)  # CARD: run the stub worker
    parser.add_argument("--kit-frontend", nargs=3, help=argparse.SUPPRESS)  # OUT DYNAMO_URL PORT
    args = parser.parse_args()
    if args.stub_worker is not None:
        asyncio.run(stub_worker(args.stub_worker))
        return 0
    if args.kit_frontend is not None:
        out, dynamo_url, port = args.kit_frontend
        asyncio.run(kit_frontend(Path(out), dynamo_url, int(port)))
        return 0
    from trtllm_kit.build.pipeline import run_build
    from trtllm_kit.spec import build_spec

    with tempfile.TemporaryDirectory(prefix="dynamo-frontends.") as tmp:
        out = Path(tmp) / "out"
        run_build(build_spec({}, {"model": "builtin:tiny-llama", "out": out,
                                  "build": {"verify": False, "target": "cpu"}}))
        dirs = DynamoDirs(Path(tmp) / "dynamo")
        for directory in (dirs.discovery, dirs.home):
            directory.mkdir(parents=True)
        write_card(out, dirs.card)
        env = dynamo_env(dirs)
        dynamo_port, kit_port = free_port(), free_port()
        dynamo_url, kit_url = f"http://{LOOPBACK}:{dynamo_port}", f"http://{LOOPBACK}:{kit_port}"
        me = [sys.executable, str(Path(__file__).absolute())]
        commands = [frontend_argv(dynamo_port, Router("round-robin"), 0), [*me, "--stub-worker", str(dirs.card)],
                    [*me, "--kit-frontend", str(out), dynamo_url, str(kit_port)]]
        processes = [subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=(Path(tmp) / f"{i}.log").open(
            "wb"), start_new_session=True) for i, argv in enumerate(commands)]
        try:
            _wait(lambda: lists_model(dynamo_url, MODEL), "Dynamo's frontend with the stub worker")
            _wait(lambda: _answers(kit_url), "the kit's frontend")
            load_before = os.getloadavg()[0]
            times = interleaved_ms({"dynamo": (dynamo_url, False), "kit": (kit_url, False),
                                    "dynamo streamed": (dynamo_url, True), "kit streamed": (kit_url, True)},
                                   args.sequential)
        except SystemExit:
            for i in range(len(commands)):
                print(f"--- process {i}:", *(Path(tmp) / f"{i}.log").read_text().splitlines()[-15:], sep="\n")
            raise
        finally:
            for process in processes:
                os.killpg(process.pid, signal.SIGTERM)
            for process in processes:
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
    p50 = {name: statistics.median(each) for name, each in times.items()}
    added = statistics.median(b - a for a, b in zip(times["dynamo"], times["kit"], strict=True))
    print(f"stub worker, p50 of {args.sequential} sequential 1-token completions per path, A/B/A/B: Dynamo's "
          f"frontend {p50['dynamo']:.2f} ms; the kit's frontend in front of it {p50['kit']:.2f} ms, so the kit's "
          f"frontend {p50['kit'] - p50['dynamo']:.2f} ms per request (p50 of each pair's difference {added:.2f} ms); "
          f"streamed: Dynamo's {p50['dynamo streamed']:.2f} ms, the kit's in front {p50['kit streamed']:.2f} ms "
          f"[load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after]", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
