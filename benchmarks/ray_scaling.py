"""``serve --ray --replicas 1:2`` under 16 concurrent clients: when Ray Serve adds and removes a replica and how many
requests fail while it does, then what a replica SIGKILLed under load costs.

    python benchmarks/ray_scaling.py [--clients 16] [--load-s 90] [--idle-s 60] [--kill-s 60] [--max-tokens 64]

Builds ``builtin:tiny-llama`` for the llmapi target and serves it with ``serve --ray --replicas 1:2
--target-ongoing 4``. Three phases, the replicas (their processes in the serve's namespace) sampled every 0.5 s:
- load: ``--clients`` threads each send non-streamed completions back to back for ``--load-s`` seconds;
- idle: no request for ``--idle-s`` seconds (Ray Serve removes a replica after 30 s below the target);
- kill: the clients again for ``--kill-s`` seconds; 10 s in, one replica's process gets SIGKILL.
Prints the replicas' timeline (seconds since the serve was ready) and, per phase, requests answered and failed
(status and first message), with the load average. Needs the ``ray`` extra and root.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trtllm_kit.build.pipeline import run_build
from trtllm_kit.serve.ray.driver import REPLICA_TITLE
from trtllm_kit.serve.server.launcher import free_endpoints, free_port
from trtllm_kit.serve.server.netns import titled_pids
from trtllm_kit.serve.service import ServeOptions, serve_detached, stop_serving
from trtllm_kit.spec import ServeSettings, build_spec

SAMPLE_S = 0.5
KILL_AFTER_S = 10.0
PROMPT_IDS = [1, 264, 333, 84, 534, 332]


@dataclass
class Phase:
    """What the clients saw in one phase."""

    name: str
    num_ok: int = 0
    failed: Counter[str] = field(default_factory=Counter)  # "status: message" → count
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, status: int, message: str = "") -> None:
        with self.lock:
            if status == 200:
                self.num_ok += 1
            else:
                self.failed[f"{status}: {message[:160]}"] += 1

    def line(self) -> str:
        failures = "; ".join(f"{count} x {what}" for what, count in self.failed.items()) or "none"
        return (f"{self.name}: {self.num_ok} requests answered, {sum(self.failed.values())} failed ({failures}); "
                f"load average {os.getloadavg()[0]:.1f}")


class Timeline:
    """The replicas' pids, sampled on a thread; a line each time they change."""

    def __init__(self, namespace: int, started: float) -> None:
        self.namespace, self.started = namespace, started
        self.events: list[str] = []
        self.pids: set[int] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def now(self) -> float:
        return time.monotonic() - self.started

    def _run(self) -> None:
        while not self.stop.wait(SAMPLE_S):
            pids = set(titled_pids(self.namespace, REPLICA_TITLE))
            if pids != self.pids:
                added, gone = sorted(pids - self.pids), sorted(self.pids - pids)
                self.events.append(f"t={self.now():6.1f} s: {len(self.pids)} -> {len(pids)} replicas"
                                   + (f", started {added}" if added else "") + (f", gone {gone}" if gone else ""))
                print(self.events[-1], flush=True)
                self.pids = pids


def client(url: str, model: str, max_tokens: int, phase: Phase, until: float) -> None:
    body = json.dumps({"model": model, "prompt": PROMPT_IDS, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True}).encode()
    while time.monotonic() < until:
        request = urllib.request.Request(f"{url}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=300) as response:
                response.read()
                phase.record(response.status)
        except urllib.error.HTTPError as exc:
            phase.record(exc.code, exc.read().decode(errors="replace"))
        except OSError as exc:
            phase.record(0, f"{type(exc).__name__}: {exc}")


def load(url: str, model: str, args: argparse.Namespace, phase: Phase, seconds: float,
         timeline: Timeline | None = None) -> None:
    until = time.monotonic() + seconds
    threads = [threading.Thread(target=client, args=(url, model, args.max_tokens, phase, until))
               for _ in range(args.clients)]
    for thread in threads:
        thread.start()
    if timeline is not None:  # the kill phase
        time.sleep(KILL_AFTER_S)
        victim = min(timeline.pids or set(titled_pids(timeline.namespace, REPLICA_TITLE)))
        os.kill(victim, signal.SIGKILL)
        print(f"t={timeline.now():6.1f} s: SIGKILL to replica {victim}", flush=True)
    for thread in threads:
        thread.join()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--load-s", type=float, default=90.0)
    parser.add_argument("--idle-s", type=float, default=60.0)
    parser.add_argument("--kill-s", type=float, default=60.0)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ray-scaling.") as tmp:
        out = Path(tmp) / "out"
        run_build(build_spec({}, {"model": "builtin:tiny-llama", "out": out, "build": {"verify": False,
                                                                                       "target": "llmapi"}}))
        port = free_port()
        state = serve_detached(ServeOptions(out=out, settings=ServeSettings(
            **asdict(free_endpoints()), openai_port=port, ready_timeout_s=600, ray=True, replicas="1:2",
            target_ongoing=4.0)))
        url = f"http://127.0.0.1:{port}"
        timeline = Timeline(state["net_namespace"], time.monotonic())
        try:
            scaling, killing = Phase("scaling up and down"), Phase("a replica SIGKILLed")
            print(f"t={timeline.now():6.1f} s: {args.clients} clients start", flush=True)
            load(url, state["model"], args, scaling, args.load_s)
            print(f"t={timeline.now():6.1f} s: clients stop; {scaling.line()}", flush=True)
            time.sleep(args.idle_s)
            print(f"t={timeline.now():6.1f} s: {args.clients} clients start", flush=True)
            load(url, state["model"], args, killing, args.kill_s, timeline)
            print(f"t={timeline.now():6.1f} s: clients stop; {killing.line()}", flush=True)
        finally:
            timeline.stop.set()
            stop_serving(out, 30)
        print("replicas:", *timeline.events, sep="\n  ")
        for phase in (scaling, killing):
            print(phase.line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
