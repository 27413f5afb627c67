"""``serve --ray --replicas 0:2``: Ray Serve's autoscaling of the model's replicas, with real Ray on this machine.

It starts with no replica and the first request is answered (scale from zero); concurrent streams above the target
add a second replica and none fails; a replica SIGKILLed is gone and the serve still answers on a new one; a
SIGKILL of serve leaves no process of Ray.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from kit_server import BuildKey, Builds, KitServer
from polling import wait_until

from trtllm_kit.serve.ray.driver import REPLICA_TITLE
from trtllm_kit.serve.server.netns import pids_in, titled_pids

if importlib.util.find_spec("ray") is None:
    pytest.skip("Ray Serve is not installed (pip install -c constraints.txt -e '.[ray]', as .ci/run does).",
                allow_module_level=True)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

READY_TIMEOUT_S = 600.0
SCALE_TIMEOUT_S = 300.0  # Ray Serve decides every few seconds; a replica's start on 2 loaded cores takes long
NUM_CLIENTS = 6
LONG_TOKENS = 400


def _replicas(server: KitServer) -> list[int]:
    """The pids of the model's replicas in the serve's namespace."""
    return titled_pids(server.state["net_namespace"], REPLICA_TITLE)


def _complete(server: KitServer, max_tokens: int) -> dict[str, Any]:
    body = {"model": server.state["model"], "prompt": [1, 264, 333], "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True}
    status, _, raw = server.post("/v1/completions", json.dumps(body).encode(), timeout_s=SCALE_TIMEOUT_S + 300)
    assert status == 200, raw
    return json.loads(raw)


def _wait(predicate: Callable[[], bool], timeout_s: float) -> bool:
    return wait_until(predicate, timeout_s, 0.5)


@pytest.fixture(scope="module")
def scaled(kit_builds: Builds, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KitServer]:
    out = kit_builds.copy(BuildKey.of(target="llmapi"), tmp_path_factory.mktemp("ray-scaling") / "out")
    with KitServer(out, ray=True, replicas="0:2", target_ongoing=1.0, ready_timeout_s=READY_TIMEOUT_S) as server:
        yield server


def test_scale_from_zero_answers_the_first_request(scaled: KitServer) -> None:
    assert _replicas(scaled) == []  # MIN 0: ready with no replica
    answer = _complete(scaled, 8)
    assert answer["usage"]["completion_tokens"] == 8
    assert len(_replicas(scaled)) >= 1


def test_concurrent_streams_add_a_second_replica_and_none_fails(scaled: KitServer) -> None:
    scaled_up = threading.Event()
    deadline = time.monotonic() + SCALE_TIMEOUT_S

    def client() -> list[int]:  # the load lasts until the second replica comes, however fast the answers are
        tokens = []
        while not scaled_up.is_set() and time.monotonic() < deadline:
            tokens.append(_complete(scaled, LONG_TOKENS)["usage"]["completion_tokens"])
        return tokens

    with ThreadPoolExecutor(NUM_CLIENTS) as pool:
        clients = [pool.submit(client) for _ in range(NUM_CLIENTS)]
        up = _wait(lambda: len(_replicas(scaled)) == 2, SCALE_TIMEOUT_S)
        scaled_up.set()
        tokens = [count for future in clients for count in future.result()]
    assert up, "no second replica under load"
    assert len(tokens) >= NUM_CLIENTS and set(tokens) == {LONG_TOKENS}, tokens


def test_a_killed_replica_is_gone_and_the_serve_answers_on_another(scaled: KitServer) -> None:
    _complete(scaled, 1)  # a replica, whatever the scale-down left (MIN is 0)
    before = _replicas(scaled)
    assert before
    os.kill(before[0], signal.SIGKILL)
    assert _wait(lambda: before[0] not in _replicas(scaled), 30)
    assert _complete(scaled, 4)["usage"]["completion_tokens"] == 4
    assert [pid for pid in _replicas(scaled) if pid != before[0]]
    assert os.path.exists(f"/proc/{scaled.state['pid']}")  # the serve lives on


def test_sigkill_of_serve_leaves_no_process_of_ray(scaled: KitServer) -> None:
    namespace = scaled.state["net_namespace"]
    assert pids_in(namespace)
    os.kill(scaled.state["pid"], signal.SIGKILL)
    # the reaper ends the driver's group (Ray's head among it); the replicas and the controller follow their raylet
    assert _wait(lambda: not pids_in(namespace), 60), f"left behind: {pids_in(namespace)}"
