"""``deploy ray``'s HTTP entry without a cluster: the ingress deployment's class started in-process starts the kit's
OpenAI frontend on its port, in front of a handle whose calls go to a ``Replica`` of the tiny cpu build in the
same process; the answer equals a plain serve's, and with a key file the gateway holds in front."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kit_server import TINY_BUILDS, Builds, Servers

from trtllm_kit.serve.gateway.keys import add_key
from trtllm_kit.serve.ray.ingress import Ingress
from trtllm_kit.serve.ray.replica import Replica
from trtllm_kit.serve.server.launcher import free_port
from trtllm_kit.wire import GenerationRequest, GenerationResponse

pytestmark = [pytest.mark.integration]

CPU = TINY_BUILDS["cpu"]
BODY = {"model": "tiny", "prompt": [1, 264, 333, 84, 534, 332], "max_tokens": 12, "temperature": 0, "logprobs": 1}


class Call:
    """A handle's streaming call, as ``ReplicaClient`` uses it: iterated, and cancelled if left early."""

    def __init__(self, stream: AsyncIterator[GenerationResponse]) -> None:
        self.stream = stream
        self.cancelled = False

    def __aiter__(self) -> AsyncIterator[GenerationResponse]:
        return self.stream

    def cancel(self) -> None:
        self.cancelled = True


class LocalHandle:
    """A deployment handle whose one replica lives in this process."""

    def __init__(self, replica: Replica) -> None:
        self.replica = replica
        self.generate = self

    def options(self, stream: bool) -> LocalHandle:
        assert stream
        return self

    def remote(self, req: GenerationRequest) -> Call:
        return Call(self.replica.generate(req))


async def _serve_and_ask(out: Path, port: int) -> tuple[list[str], dict[str, Any]]:
    ingress = Ingress(LocalHandle(Replica(str(out))), str(out), "tiny", port)
    runner = await ingress.started
    await ingress.check_health()
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as session:
            async with session.get("/v1/models") as response:
                listed = [model["id"] for model in (await response.json())["data"]]
            async with session.post("/v1/completions", json=BODY) as response:
                assert response.status == 200, await response.text()
                answer = await response.json()
    finally:
        await runner.cleanup()
    return listed, answer


async def _statuses(out: Path, port: int, keys: Path, secret: str) -> tuple[int, int, list[str]]:
    usage = keys.with_name("usage.jsonl")
    ingress = Ingress(LocalHandle(Replica(str(out))), str(out), "tiny", port, str(keys), str(usage))
    runner = await ingress.started
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as session:
            async with session.post("/v1/completions", json=BODY) as response:
                without = response.status
            async with session.post("/v1/completions", json=BODY,
                                    headers={"Authorization": f"Bearer {secret}"}) as response:
                keyed = response.status
    finally:
        await runner.cleanup()
    return without, keyed, usage.read_text().splitlines()


def test_the_ingress_serves_the_kit_frontend_in_front_of_the_model(kit_builds: Builds, kit_servers: Servers) -> None:
    out = kit_builds.get(CPU)
    listed, ours = asyncio.run(_serve_and_ask(out, free_port()))
    assert listed == ["tiny"]
    plain = kit_servers.get(CPU)
    _, _, raw = plain.post("/v1/completions", json.dumps({**BODY, "model": plain.state["model"]}).encode())
    theirs = json.loads(raw)
    assert ours["usage"] == theirs["usage"]
    assert ours["choices"][0]["logprobs"]["tokens"] == theirs["choices"][0]["logprobs"]["tokens"]


def test_with_a_key_file_the_gateway_holds_in_front(kit_builds: Builds, tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    secret, _ = add_key(keys, "team")
    without, keyed, usage = asyncio.run(_statuses(kit_builds.get(CPU), free_port(), keys, secret))
    assert (without, keyed) == (401, 200)
    [line] = usage
    assert json.loads(line)["key"] == "team" and json.loads(line)["completion_tokens"] == BODY["max_tokens"]
