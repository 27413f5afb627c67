"""``serve --dynamo``'s request migration under faults, measured here: a worker SIGKILLed every ``--kill-every-s``
seconds while ``--streams`` greedy streams run for ``--minutes`` minutes; requests sent, migrated (Dynamo's
frontend counter ``dynamo_frontend_model_migration_total``), failed, and whether every answer equals the answer
to the same prompt without faults.

    python benchmarks/dynamo_migration.py [--workers 3] [--streams 8] [--minutes 3] [--kill-every-s 20]
        [--prompts 16] [--max-tokens 96]

Builds ``builtin:tiny-llama`` for the CPU runtime and serves it with ``serve --dynamo --workers W`` on 127.0.0.1
(``--router kv``, ``--migration-limit 3``). First the reference: every prompt once, ``--streams`` at a time, no
faults. Then the faulted run: ``--streams`` clients each stream the prompts in turn (greedy, ``ignore_eos``, so
every answer is ``--max-tokens`` tokens) until the time is up, while every ``--kill-every-s`` seconds one worker
is SIGKILLed and started again with its command line and environment (the serve does not restart a dead worker,
and it ends when its last worker dies, so worker-0 is never killed: the others are killed in turn). A request
whose worker dies is migrated by Dynamo's frontend to a live worker, which continues it. Requests are sent to
Dynamo's frontend (the serve's ``dynamo_frontend``) from inside the serve's private network namespace, where the
killed workers are started again too. Prints one line of figures with units and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from trtllm_kit.build.pipeline import run_build
from trtllm_kit.serve.dynamo.frontend_client import DynamoFrontendClient
from trtllm_kit.serve.dynamo.launch import serve_net
from trtllm_kit.serve.generation import GenerationError
from trtllm_kit.serve.server.launcher import free_endpoints, free_port
from trtllm_kit.serve.service import ServeOptions, serve_detached, stop_serving
from trtllm_kit.spec import ServeSettings, build_spec
from trtllm_kit.wire import GenerationRequest
from trtllm_kit.wire.request import NEVER_END_ID

MIGRATIONS = "dynamo_frontend_model_migration_total"
PROMPT_TOKENS = 24
READY_WAIT_S = 60.0
ANSWER_TIMEOUT_S = 600.0


@dataclass
class MigrationResult:
    """The faulted run's figures."""

    minutes: float
    streams: int
    workers: int
    kills: int = 0
    sent: int = 0
    completed: int = 0
    failed: int = 0
    migrated: int = 0
    mismatched: int = 0
    errors: list[str] = field(default_factory=list)

    def line(self) -> str:
        """One line of figures with units."""
        return (f"{self.minutes:g} min, {self.streams} greedy streams on {self.workers} workers, {self.kills} "
                f"SIGKILLs: {self.sent} requests sent, {self.completed} completed, {self.migrated} migrations, "
                f"{self.failed} failed; {self.completed - self.mismatched} of {self.completed} answers equal the "
                f"unfaulted run's [load average {'{:.1f} {:.1f} {:.1f}'.format(*os.getloadavg())}]")


class Restarter:
    """SIGKILLs the serve's workers in turn and starts each again with its own command line and environment; the
    processes it started are stopped by ``close``.

    Arguments:
        state: the serve's state (``workers``: name → pid, log); spared: the worker never killed.
    """

    def __init__(self, state: dict[str, Any], spared: str = "worker-0") -> None:
        self.pids = {name: int(w["pid"]) for name, w in state["workers"].items()}
        self.logs = {name: Path(w["log"]) for name, w in state["workers"].items()}
        self.victims = [name for name in sorted(self.pids) if name != spared]
        self.started: list[subprocess.Popen[bytes]] = []
        self.num_kills = 0

    def kill_next(self) -> None:
        """SIGKILL the next worker's process group and start it again."""
        name = self.victims[self.num_kills % len(self.victims)]
        process = psutil.Process(self.pids[name])
        argv, env, cwd = process.cmdline(), process.environ(), process.cwd()
        os.killpg(self.pids[name], signal.SIGKILL)
        process.wait(10)
        self.num_kills += 1
        with self.logs[name].open("ab") as log:
            child = subprocess.Popen(argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.started.append(child)
        self.pids[name] = child.pid

    def close(self) -> None:
        """Stop the workers started here: SIGTERM, SIGKILL after 5 s."""
        for child in self.started:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for child in self.started:
            try:
                child.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()


async def stream(client: DynamoFrontendClient, prompt: list[int], max_tokens: int) -> str:
    """One greedy streamed completion's text (``ignore_eos``: ``max_tokens`` tokens), through the kit's client of
    Dynamo's frontend; raises ``GenerationError`` on a refusal or failure, ``TimeoutError`` after
    ``ANSWER_TIMEOUT_S``."""
    req = GenerationRequest(tuple(prompt), max_tokens, top_k=1, end_id=NEVER_END_ID, streaming=True)

    async def text() -> str:
        return "".join([piece async for response in client.stream(req) for piece in response.texts])

    return await asyncio.wait_for(text(), ANSWER_TIMEOUT_S)


async def reference(url: str, model: str, prompts: list[list[int]], max_tokens: int, streams: int) -> list[str]:
    """Every prompt's answer without faults, ``streams`` at a time."""
    gate = asyncio.Semaphore(streams)
    client = DynamoFrontendClient(url, model)

    async def one(prompt: list[int]) -> str:
        async with gate:
            return await stream(client, prompt, max_tokens)

    try:
        return list(await asyncio.gather(*(one(p) for p in prompts)))
    finally:
        await client.close()


async def faulted(url: str, model: str, prompts: list[list[int]], answers: list[str], max_tokens: int,
                  result: MigrationResult, kill_every_s: float, restarter: Restarter) -> None:
    """The streams until the time is up, a worker killed every ``kill_every_s`` seconds meanwhile."""
    end = time.monotonic() + result.minutes * 60
    stop = threading.Event()

    def killer() -> None:
        while not stop.wait(kill_every_s) and time.monotonic() < end:
            restarter.kill_next()

    async def streams(client: DynamoFrontendClient, number: int) -> None:
        index = number
        while time.monotonic() < end:
            result.sent += 1
            try:
                text = await stream(client, prompts[index % len(prompts)], max_tokens)
            except (GenerationError, asyncio.TimeoutError) as exc:
                result.failed += 1
                result.errors.append(f"{type(exc).__name__}: {exc}"[:300])
            else:
                result.completed += 1
                result.mismatched += text != answers[index % len(prompts)]
            index += result.streams

    thread = threading.Thread(target=killer, name="killer", daemon=True)
    thread.start()
    client = DynamoFrontendClient(url, model)
    try:
        await asyncio.gather(*(streams(client, n) for n in range(result.streams)))
    finally:
        await client.close()
        stop.set()
        thread.join()
    result.kills = restarter.num_kills


def migrations(url: str) -> int:
    """Dynamo's frontend's migrations so far, over every label."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(MIGRATIONS) and not line.startswith("#")))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=3, help="Kit workers (worker-0 is never killed).")
    parser.add_argument("--streams", type=int, default=8, help="Concurrent greedy streams.")
    parser.add_argument("--minutes", type=float, default=3.0, help="Length of the faulted run.")
    parser.add_argument("--kill-every-s", type=float, default=20.0, help="Seconds between two SIGKILLs.")
    parser.add_argument("--prompts", type=int, default=16, help="Distinct prompts.")
    parser.add_argument("--max-tokens", type=int, default=96, help="Tokens per answer.")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.workers < 2:
        parser.error(f"--workers must be at least 2 (worker-0 is never killed), got {args.workers}")
    rng = random.Random(args.seed)
    prompts = [[1] + [rng.randrange(3, 1000) for _ in range(PROMPT_TOKENS)] for _ in range(args.prompts)]
    with tempfile.TemporaryDirectory(prefix="dynamo-migration.") as tmp:
        out = Path(tmp) / "out"
        run_build(build_spec({}, {"model": "builtin:tiny-llama", "out": out,
                                  "build": {"verify": False, "target": "cpu"}}))
        state = serve_detached(ServeOptions(out=out, settings=ServeSettings(
            **asdict(free_endpoints()), openai_port=free_port(), ready_timeout_s=180, dynamo=True,
            workers=args.workers, migration_limit=3)))
        url, model = f"http://{state['dynamo_frontend']}", state["model"]
        restarter = Restarter(state)
        result = MigrationResult(args.minutes, args.streams, args.workers)

        def measure() -> None:
            answers = asyncio.run(reference(url, model, prompts, args.max_tokens, args.streams))
            before = migrations(url)
            asyncio.run(faulted(url, model, prompts, answers, args.max_tokens, result, args.kill_every_s,
                                restarter))
            time.sleep(1)
            result.migrated = migrations(url) - before

        net = serve_net(Path(state["run_dir"]) / "dynamo")
        try:
            net.call(measure)  # in the serve's network namespace: Dynamo's frontend, and the restarted workers
        finally:
            net.close()
            restarter.close()
            stop_serving(out, 30)
    for error in sorted(set(result.errors))[:5]:
        print(f"failed: {error}")
    print(result.line(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
