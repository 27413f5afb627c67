"""``serve --dynamo --router kv`` keeps a prefix's users together from its first request: a worker announces a
request's prompt blocks when it takes the request, so a second user of the prefix, routed while the first one's
prefill runs, goes to the same worker (``serve/dynamo/kv_events.py``)."""

from __future__ import annotations

import importlib.util
import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kit_server import BuildKey, Builds, KitServer

if importlib.util.find_spec("dynamo") is None or importlib.util.find_spec("dynamo.llm") is None:
    pytest.skip("NVIDIA Dynamo is not installed (pip install -e '.[dynamo]' and the ai-dynamo wheel with --no-deps, "
                "as .ci/run does).", allow_module_level=True)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NUM_PAIRS = 3
PREFIX_TOKENS = 480  # 15 blocks of 32
ANNOUNCED_S = 0.03  # a worker's announcement reaches the router well within this; a prefill's sealed blocks do not


def _served_by(state: dict[str, Any]) -> dict[str, int]:
    """Requests each worker has completed so far, from its log."""
    return {name: Path(w["log"]).read_text(errors="replace").count("request completed")
            for name, w in state["workers"].items()}


def _complete(server: KitServer, prompt: list[int]) -> None:
    body = {"model": server.state["model"], "prompt": prompt, "max_tokens": 16, "temperature": 0, "ignore_eos": True}
    status, _, raw = server.post("/v1/completions", json.dumps(body).encode())
    assert status == 200, raw


def _wait(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def test_a_second_user_sent_during_the_first_one_s_prefill_lands_on_its_worker(kit_builds: Builds,
                                                                               tmp_path: Path) -> None:
    out = kit_builds.copy(BuildKey.of(target="cpu"), tmp_path / "out")
    rng = random.Random(3)
    placed: list[list[str]] = []
    with KitServer(out, dynamo=True, workers=2, router="kv") as server:
        in_flight = Path(server.state["run_dir"]) / "dynamo" / "requests"  # a file per request a worker holds
        for _ in range(NUM_PAIRS):
            prefix = [1] + [rng.randrange(100, 1000) for _ in range(PREFIX_TOKENS - 1)]
            first, second = (prefix + [rng.randrange(100, 1000) for _ in range(16)] for _ in range(2))
            before = _served_by(server.state)
            num_done = sum(before.values()) + 2
            sender = threading.Thread(target=_complete, args=(server, first))
            sender.start()
            _wait(lambda: any(in_flight.iterdir()), 60, "the first request reached no worker")
            time.sleep(ANNOUNCED_S)
            _complete(server, second)  # routed before the first one's prefill has sealed its blocks
            sender.join()
            _wait(lambda: sum(_served_by(server.state).values()) == num_done, 10,  # noqa: B023 (waited for at once)
                  "a worker did not log its request")
            after = _served_by(server.state)
            placed.append(sorted(name for name in after for _ in range(after[name] - before[name])))
    assert all(len(set(workers)) == 1 for workers in placed), placed
