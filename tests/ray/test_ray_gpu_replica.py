"""``serve --ray --gpu-replicas`` without Ray or a GPU: a replica's placement group as Ray Serve validates it, its
trtllm-serve command, the request mapping against a stand-in trtllm-serve, and the refusal where GPUs are missing."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from kit_server import BuildKey, Builds
from ray import serve
from ray.serve.schema import DeploymentSchema

from trtllm_kit.artifact.machine import Machine
from trtllm_kit.errors import KitError, KitUsageError
from trtllm_kit.gpus import GPU
from trtllm_kit.serve.ray import driver
from trtllm_kit.serve.ray.gpu_replica import (
    COMPLETIONS,
    GpuReplica,
    check_gpu_replicas,
    choice_response,
    completion_body,
    completion_responses,
    deployment_options,
    refusal,
    replica_argv,
    server_environment,
)
from trtllm_kit.serve.server.process import group_alive
from trtllm_kit.serve.server.trtllm_serve import answers, launch_argv
from trtllm_kit.wire import GenerationRequest, GenerationResponse

sys.path.insert(0, str(Path(__file__).parents[1] / "llmapi"))
from fake_trtllm_serve import trtllm_serve_path

LLMAPI = BuildKey.of(target="llmapi")
H100 = GPU("NVIDIA H100 80GB HBM3", 80 * 2**30, (9, 0), "nvml")


def _machine(num_gpus: int) -> Machine:
    return Machine("1.2.1", "10.13", "12.9", "575.57", (H100,) * num_gpus, has_trtllm_build=True)


@pytest.fixture(scope="module")
def llmapi_out(kit_builds: Builds) -> Path:
    return kit_builds.get(LLMAPI)


@pytest.mark.parametrize(("tp_size", "pp_size", "num_bundles"), [(1, 1, 1), (2, 1, 2), (2, 2, 4)])
def test_a_replica_takes_one_gpu_bundle_per_rank_packed_on_one_node(tp_size: int, pp_size: int,
                                                                     num_bundles: int) -> None:
    options = deployment_options(tp_size, pp_size)
    deployment = serve.deployment(name="model", **options)(GpuReplica)  # Ray Serve's own checks of the options
    assert deployment._replica_config.placement_group_bundles == [{"GPU": 1, "CPU": 1}] * num_bundles
    assert deployment._replica_config.placement_group_strategy == "STRICT_PACK"
    assert deployment._replica_config.ray_actor_options["num_cpus"] == 1  # the actor fits in the first bundle
    schema = DeploymentSchema(name="model", **options)  # and the schema serveConfigV2 is read with
    assert schema.placement_group_bundles == [{"GPU": 1.0, "CPU": 1.0}] * num_bundles
    assert schema.placement_group_strategy == "STRICT_PACK"


def test_ray_serve_refuses_an_actor_larger_than_the_first_bundle() -> None:
    options = {**deployment_options(2, 1), "ray_actor_options": {"num_cpus": 2}}
    with pytest.raises(ValueError, match="subset of the first bundle"):
        serve.deployment(name="model", **options)(GpuReplica)


def test_the_replicas_trtllm_serve_command_is_the_plain_serves(llmapi_out: Path) -> None:
    argv = replica_argv(llmapi_out, 8123)
    assert argv == launch_argv(llmapi_out, "127.0.0.1", 8123)
    assert argv[0] == "trtllm-serve" and argv[1] == str(llmapi_out.absolute() / "checkpoint")
    assert argv[argv.index("--host") + 1:argv.index("--host") + 2] == ["127.0.0.1"]
    assert argv[argv.index("--port") + 1] == "8123"


def test_a_replica_starts_trtllm_serve_waits_for_health_and_stops_its_group(
        llmapi_out: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = trtllm_serve_path(tmp_path / "bin", with_fake=True)
    for name in ("PATH", "FAKE_CALLS"):
        monkeypatch.setenv(name, fake.env[name])
    replica = GpuReplica(str(llmapi_out))
    pid = replica.server.pid
    assert pid is not None and group_alive(pid)
    assert answers(f"http://127.0.0.1:{replica.port}/health")
    [call] = fake.calls()
    assert call["argv"] == replica_argv(llmapi_out, replica.port)[1:]
    assert call["gpus"] == os.environ.get("CUDA_VISIBLE_DEVICES")  # outside Ray: the GPUs are left as they are
    replica.stop()
    assert not group_alive(pid)


def test_a_replica_without_trtllm_serve_says_what_to_install(llmapi_out: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", trtllm_serve_path(tmp_path / "bin", with_fake=False).env["PATH"])
    with pytest.raises(KitError, match=r"^trtllm-serve is not on PATH where the replica runs, so .* cannot be "
                                       r"served with --gpu-replicas; install TensorRT-LLM 1.0 or later"):
        GpuReplica(str(llmapi_out))


def test_trtllm_serve_sees_the_bundles_gpus() -> None:
    assert server_environment(("2", "3"))["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert server_environment(None).get("CUDA_VISIBLE_DEVICES") == os.environ.get("CUDA_VISIBLE_DEVICES")


def test_without_gpus_the_gpu_replicas_are_refused_in_one_sentence(llmapi_out: Path) -> None:
    with pytest.raises(KitUsageError) as caught:
        check_gpu_replicas(llmapi_out, _machine(0))
    assert str(caught.value) == ("--gpu-replicas needs 1 GPU(s) per replica (tp 1 x pp 1) and this machine has 0 "
                                 "visible; run it where the GPUs are, or leave --gpu-replicas out to serve on the CPU "
                                 "runtime.")
    check_gpu_replicas(llmapi_out, _machine(1))  # one GPU is enough for tp 1


def test_the_driver_refuses_gpu_replicas_here_before_ray_starts(llmapi_out: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    code = driver.main([str(llmapi_out), "--name", "m", "--ray-dir", str(tmp_path), "--listen-fd", "99",
                        "--replicas", "1:1", "--target-ongoing", "2", "--router", "pow2",
                        "--ready-file", str(tmp_path / "ready"), "--gpu-replicas"])
    assert code == 1
    assert capsys.readouterr().err.startswith("Error: --gpu-replicas needs 1 GPU(s) per replica (tp 1 x pp 1) and "
                                              "this machine has 0 visible;")
    assert not (tmp_path / "ready").exists()


async def _stand_in(seen: list[dict[str, Any]]) -> tuple[web.AppRunner, str]:
    """A stand-in trtllm-serve: /v1/completions answers the prompt's ids (a text's code points) plus one, as token
    ids when asked not to detokenize (else as text), whole or as events with the running usage, then the usage
    alone."""

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append(body)
        prompt = body["prompt"] if isinstance(body["prompt"], list) else [ord(c) for c in body["prompt"]]
        ids = [token + 1 for token in prompt]
        as_ids = body.get("detokenize", True) is False

        def choice(tokens: list[int], finish_reason: str | None) -> dict[str, Any]:
            return {"index": 0, "text": "" if as_ids else "".join(f"t{t}" for t in tokens),
                    "token_ids": tokens if as_ids else None, "finish_reason": finish_reason}

        def usage(num_tokens: int) -> dict[str, int]:
            return {"prompt_tokens": len(ids), "completion_tokens": num_tokens}

        if not body["stream"]:
            return web.json_response({"object": "text_completion", "usage": usage(len(ids)),
                                      "choices": [choice(ids, "length")]})
        answer = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await answer.prepare(request)
        for i, token in enumerate(ids):
            chunk = {"choices": [choice([token], "length" if i == len(ids) - 1 else None)], "usage": usage(i + 1)}
            await answer.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await answer.write(f"data: {json.dumps({'choices': [], 'usage': usage(len(ids))})}\n\n".encode())
        await answer.write(b"data: [DONE]\n\n")
        return answer

    app = web.Application()
    app.router.add_post(COMPLETIONS, completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}{COMPLETIONS}"


async def _collect(url: str, req: GenerationRequest) -> list[GenerationResponse]:
    async with aiohttp.ClientSession() as session:
        responses: AsyncIterator[GenerationResponse] = completion_responses(session, url, completion_body("m", req))
        return [response async for response in responses]


def _round_trip(req: GenerationRequest) -> tuple[list[dict[str, Any]], list[GenerationResponse]]:
    seen: list[dict[str, Any]] = []

    async def run() -> list[GenerationResponse]:
        runner, url = await _stand_in(seen)
        try:
            return await _collect(url, req)
        finally:
            await runner.cleanup()

    return seen, asyncio.run(run())


STREAMED = {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}


@pytest.mark.parametrize("streaming", [False, True])
def test_a_token_id_request_round_trips_through_trtllm_serves_completions(streaming: bool) -> None:
    req = GenerationRequest(prompt=(5, 6, 7), max_tokens=3, temperature=0.0, streaming=streaming,
                            stop_strings=("\n",))
    seen, responses = _round_trip(req)
    assert seen == [{"model": "m", "prompt": [5, 6, 7], **(STREAMED if streaming else {"stream": False}),
                     "max_tokens": 3, "temperature": 0.0, "detokenize": False, "stop": ["\n"]}]
    assert [token for response in responses for token in response.token_ids] == [6, 7, 8]
    assert len(responses) == (4 if streaming else 1)  # streamed: a chunk per token, then the usage alone
    assert [reason for response in responses for reason in response.finish_reasons] == ["length"]
    assert (responses[-1].num_input_tokens, responses[-1].num_output_tokens) == (3, 3)
    assert not "".join(text for response in responses for text in response.texts)


def test_a_text_request_is_answered_in_text() -> None:
    seen, responses = _round_trip(GenerationRequest(prompt="hi", max_tokens=2, streaming=False))
    assert seen == [{"model": "m", "prompt": "hi", "stream": False, "max_tokens": 2}]
    assert responses[0].texts == ("t105t106",) and responses[0].token_ids == ()


def test_an_error_answer_is_refused_with_its_message() -> None:
    with pytest.raises(KitError, match=r"^trtllm-serve refused the request: max_tokens is too large$"):
        choice_response({"object": "error", "message": "max_tokens is too large", "type": "BadRequest", "code": 400})


@pytest.mark.parametrize(("fields", "sentence"), [
    ({"logprobs": 2}, "logprobs is 2; --gpu-replicas returns no logprobs: leave logprobs (and echo) out."),
    ({"n": 2}, "n is 2, best_of None and beam_width None; --gpu-replicas answers one choice: send n=1 without "
               "best_of or beams."),
    ({"length_penalty": 0.5}, "length_penalty is 0.5; --gpu-replicas decode without beams, which it weighs: leave "
                              "length_penalty out."),
    ({}, None)])
def test_what_a_gpu_replica_does_not_carry_is_refused_in_one_sentence(fields: dict[str, Any],
                                                                      sentence: str | None) -> None:
    assert refusal(GenerationRequest(prompt=(1, 2), **fields)) == sentence


def test_a_4xx_of_trtllm_serve_is_the_requests_fault() -> None:
    async def run() -> None:
        async def bad(_request: web.Request) -> web.Response:
            return web.Response(status=400, text="prompt too long")

        app = web.Application()
        app.router.add_post(COMPLETIONS, bad)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        try:
            await _collect(f"http://127.0.0.1:{runner.addresses[0][1]}{COMPLETIONS}", GenerationRequest(prompt=(1,)))
        finally:
            await runner.cleanup()

    with pytest.raises(KitUsageError, match=r"^trtllm-serve answered 400 to /v1/completions: prompt too long$"):
        asyncio.run(run())
