"""``serve --ray`` of a cpu artifact behind the gateway (``--api-keys``), two replicas under the prefix router, with
real Ray on this machine.

The cpu artifact answers as its plain serve does; the gateway holds in front (401 without a key, 429 on a spent
quota, usage counted); a client that drops its stream frees the replica's request (the engine idle again, its KV
blocks back, within a few steps of the tokens it had); prompts sharing a first block go to one replica each.
"""

from __future__ import annotations

import importlib.util
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kit_server import TINY_BUILDS, Builds, KitServer, Servers, open_stream
from prefix_turns import replicas_by_prefix

from trtllm_kit.serve.gateway.keys import add_key
from trtllm_kit.serve.ray.engine_load import ENDED, EngineLoad, replica_logs

if importlib.util.find_spec("ray") is None:
    pytest.skip("Ray Serve is not installed (pip install -c constraints.txt -e '.[ray]', as .ci/run does).",
                allow_module_level=True)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CPU = TINY_BUILDS["cpu"]
READY_TIMEOUT_S = 600.0
PROMPT_IDS = [1, 264, 333, 84, 534, 332]
QUOTA = 20  # tokens a day of the key "small": admitted while fewer are used
KEYS = {"open": {}, "small": {"quota_tokens": QUOTA, "quota_period": "day"}}
LONG_TOKENS = 900
MAX_STEPS = 50  # engine steps between the client's leaving and the engine's abort, on a loaded machine
HANG_S = 120.0
NUM_TURNS = 6


@dataclass
class Gated:
    server: KitServer
    keys_path: Path
    secrets: dict[str, str]

    def post(self, body: dict[str, Any], key: str | None = "open") -> tuple[int, dict[str, Any]]:
        headers = {"Authorization": f"Bearer {self.secrets[key]}"} if key else {}
        status, _, raw = self.server.post("/v1/completions", json.dumps(body).encode(), headers, timeout_s=HANG_S)
        return status, json.loads(raw)

    def usage(self, key: str) -> list[dict[str, Any]]:
        path = self.keys_path.with_name(self.keys_path.name + ".usage.jsonl")
        lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        return [line for line in lines if line["key"] == key]

    def logs(self) -> dict[str, list[str]]:
        return replica_logs(Path(self.server.state["run_dir"], "ray", "tmp"))


@pytest.fixture(scope="module")
def gated(kit_builds: Builds, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gated]:
    root = tmp_path_factory.mktemp("ray-gateway")
    out, keys_path = kit_builds.copy(CPU, root / "out"), root / "keys.json"
    secrets = {name: add_key(keys_path, name, **limits)[0] for name, limits in KEYS.items()}
    with KitServer(out, ray=True, replicas="2:2", router="prefix", api_keys=keys_path,
                   ready_timeout_s=READY_TIMEOUT_S) as server:
        yield Gated(server, keys_path, secrets)


def _body(max_tokens: int, prompt: Any = None, **more: Any) -> dict[str, Any]:
    return {"model": "builtin:tiny-llama", "prompt": PROMPT_IDS if prompt is None else prompt,
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, **more}


def test_the_cpu_artifact_answers_as_its_plain_serve(gated: Gated, kit_servers: Servers) -> None:
    assert gated.server.state["target"] == "cpu"
    assert gated.server.state["router"] == "prefix"
    status, ours = gated.post(_body(24, logprobs=1))
    assert status == 200, ours
    plain = kit_servers.get(CPU)
    _, _, raw = plain.post("/v1/completions", json.dumps(_body(24, logprobs=1)).encode())
    theirs = json.loads(raw)
    assert ours["usage"] == theirs["usage"]
    assert ours["choices"][0]["logprobs"]["tokens"] == theirs["choices"][0]["logprobs"]["tokens"]


def test_a_request_without_a_key_is_refused_401(gated: Gated) -> None:
    status, answer = gated.post(_body(4), key=None)
    assert status == 401, answer
    assert answer["error"]["code"] == "invalid_api_key"


def test_a_spent_quota_is_refused_429_and_usage_is_counted(gated: Gated) -> None:
    assert gated.post(_body(8), key="small")[0] == 200  # 6 prompt + 8 completion tokens: 14 of 20 used
    assert gated.post(_body(8), key="small")[0] == 200  # 28 of 20: the quota is spent
    status, answer = gated.post(_body(8), key="small")
    assert status == 429, answer
    assert answer["error"]["code"] == "quota_exceeded"
    usage = gated.usage("small")
    assert [(line["prompt_tokens"], line["completion_tokens"]) for line in usage] == [(6, 8), (6, 8)]


def _last_step(lines: list[str]) -> int:
    loads = [load for load in map(EngineLoad.parse, lines) if load is not None]
    return loads[-1].step if loads else 0


def test_a_dropped_stream_frees_the_replicas_request(gated: Gated) -> None:
    before = gated.logs()
    sock = open_stream(gated.server.state, _body(LONG_TOKENS, stream=True), 3,
                       headers={"Authorization": f"Bearer {gated.secrets['open']}"}, timeout_s=HANG_S)
    sock.close()
    deadline = time.monotonic() + HANG_S
    while True:
        logs = gated.logs()
        new = {name: lines[len(before.get(name, [])):] for name, lines in logs.items()}
        left = [(name, ENDED.search(line)) for name, lines in new.items() for line in lines if ENDED.search(line)]
        idle = [(name, load) for name, lines in new.items() for load in map(EngineLoad.parse, lines)
                if load is not None and load.active == load.queued == 0]
        if left and any(name == left[0][0] for name, _ in idle):
            break
        assert time.monotonic() < deadline, f"the replica never went idle: {new}"
        time.sleep(0.2)
    name, ended = left[0]
    assert ended is not None and ended["how"] == "left"
    assert int(ended["tokens"]) < LONG_TOKENS
    load = [load for other, load in idle if other == name][-1]
    assert load.free_blocks == load.num_blocks  # every KV block back
    assert load.step - _last_step(before.get(name, [])) <= int(ended["tokens"]) + MAX_STEPS


def test_prompts_sharing_a_first_block_stick_to_one_replica(gated: Gated) -> None:
    served = replicas_by_prefix(gated.server, NUM_TURNS, {"Authorization": f"Bearer {gated.secrets['open']}"})
    assert all(len(replicas) == 1 for replicas in served.values()), served
