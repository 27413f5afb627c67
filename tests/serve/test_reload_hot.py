"""Hot reload against a real tritonserver (CPU runtime, an API key so Triton's repository API needs the per-launch
token): a bounded load keeps running across ``reload`` with no failed request and the version visible before and
after; a reload refused for memory changes nothing."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiohttp
import pytest
import torch
from kit_server import ONE_EACH, BuildKey, Builds, KitServer

from trtllm_kit.cli import run
from trtllm_kit.errors import KitUsageError
from trtllm_kit.serve.fleet.reload import request_reload
from trtllm_kit.serve.server.state import read_state, run_dir, serving_pid

MODEL = "builtin:tiny-llama"
KEY = "sk-test-reload"
MAX_REQUESTS, CONCURRENCY, RELOAD_AFTER, AFTER_RELOAD = 3000, 6, 60, 60


BATCH4 = BuildKey.of(max_batch_size=4)
HUGE = BuildKey.of(max_batch_size=4, repo={**ONE_EACH, "max_tokens_in_paged_kv_cache": 2**40})  # ~3 PB of float32 KV


@pytest.fixture(scope="module")
def served(kit_builds: Builds, tmp_path_factory: pytest.TempPathFactory):
    """Its own serve (it reloads) of a copy of the session's build, with an API key."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("reload")
    v1, v2, huge = kit_builds.copy(BATCH4, root / "v1"), kit_builds.copy(BATCH4, root / "v2"), kit_builds.copy(
        HUGE, root / "huge")
    server = KitServer(v1, api_key=KEY).start()
    yield server.port, v1, v2, huge
    if serving_pid(v1) is not None:
        server.stop()


async def one(http: aiohttp.ClientSession, port: int, i: int) -> tuple[int, str, str, float]:
    """One completion: status, model version, fingerprint and the monotonic time it was sent."""
    body = {"model": MODEL, "prompt": [5 + i % 7, 6, 7], "max_tokens": 4, "ignore_eos": True}
    sent = time.monotonic()
    async with http.post(f"http://127.0.0.1:{port}/v1/completions", json=body,
                         headers={"Authorization": f"Bearer {KEY}"}) as response:
        answer = await response.json()
        return (response.status, response.headers.get("x-trtllm-kit-model-version", ""),
                answer.get("system_fingerprint", json.dumps(answer)), sent)


async def load_with_reload(port: int, v1: Path, v2: Path) -> tuple[list, dict, float]:
    """CONCURRENCY requests at a time (at most MAX_REQUESTS); the reload starts once RELOAD_AFTER have been
    answered, and the load goes on until AFTER_RELOAD more have been answered after it returned."""
    results: list[tuple[int, str, str, float]] = []
    started = asyncio.Event()
    finished: list[int] = []  # the number of results when the reload returned
    issued = iter(range(MAX_REQUESTS))

    async def worker(http: aiohttp.ClientSession) -> None:
        for i in issued:
            if finished and len(results) >= finished[0] + AFTER_RELOAD:
                return
            results.append(await one(http, port, i))
            if len(results) >= RELOAD_AFTER:
                started.set()

    async def reload() -> tuple[dict, float]:
        await started.wait()
        result = await asyncio.get_running_loop().run_in_executor(None, request_reload, v1, MODEL, v2, 300.0)
        finished.append(len(results))
        return result, time.monotonic()

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        *_, (result, done) = await asyncio.gather(*(worker(http) for _ in range(CONCURRENCY)), reload())
    return results, result, done


@pytest.mark.integration
@pytest.mark.slow
def test_reload_under_load_drops_no_request(served) -> None:
    port, v1, v2, _ = served
    results, result, done = asyncio.run(load_with_reload(port, v1, v2))
    assert [r for r in results if r[0] != 200] == []
    versions = [r[1] for r in results]
    assert versions.count("1") >= RELOAD_AFTER and versions.count("2") > 0
    assert all(fingerprint == f"{MODEL}-v{version}" for _, version, fingerprint, _ in results)
    after = [version for _, version, _, sent in results if sent > done]  # sent once reload had returned
    assert after and set(after) == {"2"}
    print(f"reload under load: {len(results)} requests, 0 failed, {versions.count('1')} on v1 and "
          f"{versions.count('2')} on v2; switched after {result['switch_s']:.2f} s, done in {result['total_s']:.2f} s "
          f"with {result['in_flight_at_switch']} in flight at the switch")
    assert result["old_version"] == 1 and result["version"] == 2 and result["drained"]
    assert result["models"][0] == "builtin_tiny-llama__v2__tensorrt_llm" and "tensorrt_llm" in result["unloaded"]
    repo = run_dir(v1) / "repo"
    assert sorted(p.name for p in repo.iterdir()) == sorted(result["models"])  # the old copies are gone
    assert read_state(v1)["routes"][0]["version"] == 2 and serving_pid(v2) == serving_pid(v1)


@pytest.mark.integration
def test_reload_that_does_not_fit_changes_nothing(served, capsys) -> None:
    _, v1, _, huge = served
    before = (read_state(v1)["routes"], sorted(p.name for p in (run_dir(v1) / "repo").iterdir()))
    with pytest.raises(KitUsageError, match=r"^.*huge next to the served models do not fit in this machine's memory: "
                       r"they need [\d.]+ GiB .* is available, [\d.]+ GiB missing; "):
        request_reload(v1, MODEL, huge, 60)
    assert run(["reload", "nope", str(huge), "--out", str(v1), "--json"]) == 2
    assert f"no served model is named 'nope'; this server serves {MODEL}" in capsys.readouterr().err
    assert (read_state(v1)["routes"], sorted(p.name for p in (run_dir(v1) / "repo").iterdir())) == before
    assert serving_pid(huge) is None
