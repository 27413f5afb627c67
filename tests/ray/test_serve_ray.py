"""``serve --ray --replicas 2:2 --router pow2`` with real Ray on this machine: a private Ray in a network namespace of
its own, the model as two replicas of a Ray Serve deployment behind the kit's OpenAI frontend.

The greedy answer equals a plain serve's token for token, streamed and whole; Ray Serve's default router spreads the
prompts of one prefix over both replicas (what the prefix router, ``test_ray_gateway.py``, does not); stop leaves no
process of Ray.
"""

from __future__ import annotations

import importlib.util
import json
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from kit_server import BuildKey, Builds, KitServer, Servers
from prefix_turns import replicas_by_prefix

from trtllm_kit.serve.server.netns import pids_in

if importlib.util.find_spec("ray") is None:
    pytest.skip("Ray Serve is not installed (pip install -c constraints.txt -e '.[ray]', as .ci/run does).",
                allow_module_level=True)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LLMAPI = BuildKey.of(target="llmapi")
PROMPT_IDS = [1, 264, 333, 84, 534, 332]  # token ids: both frontends see the same prompt, BOS included
READY_TIMEOUT_S = 600.0  # a private Ray, its controller and two replicas on 2 loaded cores
NUM_TURNS = 8  # both prefixes on one replica each by chance: 1 in 2**14


def _body(model: str, max_tokens: int, **more: Any) -> bytes:
    return json.dumps({"model": model, "prompt": PROMPT_IDS, "max_tokens": max_tokens, "temperature": 0,
                       "logprobs": 1, **more}).encode()


def _complete(server: KitServer, model: str, max_tokens: int) -> dict[str, Any]:
    status, _, raw = server.post("/v1/completions", _body(model, max_tokens))
    assert status == 200, raw
    return json.loads(raw)


def _stream(server: KitServer, model: str, max_tokens: int) -> tuple[list[str], str | None]:
    """A streamed greedy completion: its text pieces and finish reason."""
    request = urllib.request.Request(f"{server.url}/v1/completions",
                                     data=_body(model, max_tokens, stream=True, ignore_eos=True),
                                     headers={"Content-Type": "application/json"})
    pieces, reason = [], None
    with urllib.request.urlopen(request, timeout=300) as response:
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            event = json.loads(line.removeprefix("data:"))
            assert "error" not in event, event
            for choice in event.get("choices") or []:
                pieces.append(choice.get("text") or "")
                reason = choice.get("finish_reason") or reason
    return pieces, reason


@pytest.fixture(scope="module")
def on_ray(kit_builds: Builds, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KitServer]:
    out = kit_builds.copy(LLMAPI, tmp_path_factory.mktemp("ray") / "out")
    with KitServer(out, ray=True, replicas="2:2", router="pow2", ready_timeout_s=READY_TIMEOUT_S) as server:
        yield server


def test_models_lists_the_artifact_and_the_state_says_ray(on_ray: KitServer) -> None:
    with urllib.request.urlopen(f"{on_ray.url}/v1/models", timeout=30) as response:
        listed = json.loads(response.read())
    assert [m["id"] for m in listed["data"]] == [on_ray.state["model"]]
    assert on_ray.state["server"] == "ray"
    assert on_ray.state["replicas"] == {"min": 2, "max": 2}
    assert Path(on_ray.state["run_dir"], "ray", "tmp").resolve().is_dir()  # Ray's temp dir, linked from the run dir


def test_greedy_answer_equals_a_plain_serve_token_for_token(on_ray: KitServer, kit_servers: Servers) -> None:
    plain = kit_servers.get(LLMAPI)
    model = on_ray.state["model"]
    ours, theirs = _complete(on_ray, model, 24), _complete(plain, model, 24)
    assert ours["usage"] == theirs["usage"]
    assert ours["choices"][0]["logprobs"]["tokens"] == theirs["choices"][0]["logprobs"]["tokens"]
    assert ours["choices"][0]["text"] == theirs["choices"][0]["text"]
    assert len(ours["choices"][0]["logprobs"]["tokens"]) == 24


def test_streamed_answer_comes_in_pieces_and_equals_the_plain_serves(on_ray: KitServer,
                                                                     kit_servers: Servers) -> None:
    model = on_ray.state["model"]
    ours, reason = _stream(on_ray, model, 32)
    theirs, their_reason = _stream(kit_servers.get(LLMAPI), model, 32)
    assert reason == their_reason == "length"
    assert len([piece for piece in ours if piece]) > 1  # streamed, not one whole answer
    assert "".join(ours) == "".join(theirs)


def test_the_ray_processes_live_in_the_serves_own_network_namespace(on_ray: KitServer) -> None:
    namespace = on_ray.state["net_namespace"]
    assert namespace != os.stat("/proc/self/ns/net").st_ino
    names = {Path(f"/proc/{pid}/comm").read_text().strip() for pid in pids_in(namespace)}
    assert {"gcs_server", "raylet"} <= names
    assert any(name.startswith("ray::ServeRepl") for name in names)  # a replica of the model


def test_without_the_prefix_router_a_prefix_goes_to_both_replicas(on_ray: KitServer) -> None:
    assert on_ray.state["router"] == "pow2"
    served = replicas_by_prefix(on_ray, NUM_TURNS)
    assert any(len(replicas) == 2 for replicas in served.values()), served


def test_stop_leaves_no_process_of_ray(on_ray: KitServer) -> None:
    namespace = on_ray.state["net_namespace"]
    assert pids_in(namespace)
    on_ray.stop()
    assert pids_in(namespace) == []  # SIGKILL reached every process of the namespace, replicas included
    assert not os.path.exists(f"/proc/{on_ray.state['pid']}") or \
        psutil.Process(on_ray.state["pid"]).status() == psutil.STATUS_ZOMBIE
