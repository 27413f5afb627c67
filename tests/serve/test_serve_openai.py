"""One real tritonserver behind ``trtllm-kit serve --detach --openai-port``: the OpenAI API, generate, stop."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import openai
import psutil
import pytest
import tritonclient.grpc as grpcclient
from kit_cli import KIT
from tritonclient.utils import InferenceServerException

from trtllm_kit.serve.server.launcher import GRPC_RESTRICTED_HEADER, free_endpoints, free_port
from trtllm_kit.serve.server.state import TOKEN_FILE, read_state, run_dir

pytestmark = pytest.mark.integration
KEY = "sk-test-key"
MODEL = "builtin:tiny-llama"


def kit(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KIT, *args],
                          capture_output=True, text=True, timeout=120, **kwargs)


@pytest.fixture(scope="module")
def server(fake_out: Path) -> dict[str, Any]:
    ep, openai_port = free_endpoints(), free_port()
    done = kit("serve", str(fake_out), "--http-port", str(ep.http_port), "--grpc-port", str(ep.grpc_port),
               "--metrics-port", str(ep.metrics_port), "--openai-port", str(openai_port), "--detach",
               env={**os.environ, "TRTLLM_KIT_API_KEY": KEY})
    assert done.returncode == 0, done.stderr
    state = read_state(fake_out)
    assert state is not None and state["ready"]
    server = psutil.Process(state["server_pid"])
    state["stub_pids"] = [child.pid for child in server.children()]
    yield state
    if read_state(fake_out) is not None:
        kit("stop", str(fake_out))


@pytest.fixture(scope="module")
def client(server: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{server['openai']}/v1", api_key=KEY, max_retries=0)


def post(server: dict[str, Any], path: str, body: dict[str, Any], key: str | None = KEY) -> tuple[int, bytes]:
    request = urllib.request.Request(f"http://{server['openai']}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_models(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert "max_model_len" in client.models.list().data[0].model_dump()


def test_health_answers_ready_without_the_key(server: dict[str, Any]) -> None:
    with urllib.request.urlopen(f"http://{server['openai']}/health", timeout=30) as response:
        assert response.status == 200


def test_logprobs_need_the_direct_path_to_tensorrt_llm(server: dict[str, Any]) -> None:
    status, body = post(server, "/v1/completions", {"model": MODEL, "prompt": "x", "logprobs": 1})
    error = json.loads(body)["error"]
    assert (status, error["param"]) == (400, "logprobs") and "tensorrt_llm model" in error["message"]


def test_completion_with_usage_and_length(client: openai.OpenAI) -> None:
    done = client.completions.create(model=MODEL, prompt="one two three", max_tokens=5)
    assert done.choices[0].text == " w0 w1 w2 w3 w4" and done.choices[0].finish_reason == "length"
    assert (done.usage.prompt_tokens, done.usage.completion_tokens, done.usage.total_tokens) == (3, 5, 8)


def test_completion_stops_at_a_stop_sequence_and_at_eos(client: openai.OpenAI) -> None:
    done = client.completions.create(model=MODEL, prompt="count", max_tokens=50, stop=[" w3", "nothing"])
    assert (done.choices[0].text, done.choices[0].finish_reason) == (" w0 w1 w2", "stop")
    short = client.completions.create(model=MODEL, prompt="short", max_tokens=50)
    assert (short.choices[0].text, short.choices[0].finish_reason, short.usage.completion_tokens) == \
        (" w0 w1 w2", "stop", 3)


def test_min_tokens_and_ignore_eos_reach_the_model(client: openai.OpenAI) -> None:
    at_least = client.completions.create(model=MODEL, prompt="short", max_tokens=50, extra_body={"min_tokens": 5})
    assert (at_least.usage.completion_tokens, at_least.choices[0].finish_reason) == (5, "stop")
    forced = client.completions.create(model=MODEL, prompt="short", max_tokens=8, extra_body={"ignore_eos": True})
    assert (forced.usage.completion_tokens, forced.choices[0].finish_reason) == (8, "length")


def test_token_id_prompts_need_a_tensorrt_llm_model(server: dict[str, Any]) -> None:
    status, body = post(server, "/v1/completions", {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 2})
    assert status == 404 and "tensorrt_llm" in json.loads(body)["error"]["message"]


def test_sampling_fields_reach_the_model(client: openai.OpenAI) -> None:
    done = client.completions.create(model=MODEL, prompt="x", max_tokens=2, temperature=0.7, top_p=0.9, seed=42)
    assert done.choices[0].text == " s42w0 s42w1"


def test_streaming_completion_over_plain_http(server: dict[str, Any]) -> None:
    status, body = post(server, "/v1/completions", {"model": MODEL, "prompt": "a b", "max_tokens": 4, "stream": True,
                                                    "stream_options": {"include_usage": True}})
    events = [line[len("data: "):] for line in body.decode().split("\n\n") if line]
    assert status == 200 and events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == " w0 w1 w2 w3"
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert chunks[-1]["usage"] == {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}


def test_usage_in_every_chunk_when_asked(server: dict[str, Any]) -> None:
    status, body = post(server, "/v1/completions", {
        "model": MODEL, "prompt": "a b", "max_tokens": 3, "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    assert status == 200
    events = [line[len("data: "):] for line in body.decode().split("\n\n") if line]
    chunks = [json.loads(event) for event in events[:-1]]  # the last is [DONE]
    assert [c["usage"]["completion_tokens"] for c in chunks] == [1, 2, 3, 3, 3]  # words, finish, final usage
    assert all(c["usage"]["prompt_tokens"] == 2 for c in chunks)


def test_chat_completion_whole_and_streamed(client: openai.OpenAI) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    done = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3)
    assert done.choices[0].message.content == " w0 w1 w2" and done.choices[0].finish_reason == "length"
    assert done.usage.completion_tokens == 3 and done.usage.prompt_tokens > 0
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, stop="w4", stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == " w0 w1 w2 w3 "
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage.completion_tokens == 5


def test_errors_in_openai_format(server: dict[str, Any], client: openai.OpenAI) -> None:
    status, body = post(server, "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 0})
    assert status == 400 and json.loads(body) == {"error": {
        "message": "max_tokens must be a positive integer, got 0.", "type": "invalid_request_error",
        "param": "max_tokens", "code": None}}
    status, body = post(server, "/v1/completions", {"prompt": "x"})
    assert status == 400 and json.loads(body)["error"] == {
        "message": f"'model' is required; this server has {MODEL!r}.", "type": "invalid_request_error",
        "param": "model", "code": None}
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="gpt-4", prompt="x")
    assert info.value.body["code"] == "model_not_found"
    with pytest.raises(openai.InternalServerError, match="the prompt asks to fail"):
        client.completions.create(model=MODEL, prompt="please fail", max_tokens=2)


def scrape(server: dict[str, Any]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The frontend's /metrics, parsed by prometheus_client: (sample name, sorted labels) → value."""
    from prometheus_client.parser import text_string_to_metric_families

    request = urllib.request.Request(f"http://{server['openai']}/metrics", headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_count_requests_errors_and_time_tokens(server: dict[str, Any], client: openai.OpenAI) -> None:
    before = scrape(server)
    ok = (("endpoint", "completions"), ("model", MODEL), ("status", "200"))
    bad = (("endpoint", "completions"), ("model", MODEL), ("status", "400"))
    ttft = ("trtllm_kit_openai_time_to_first_token_seconds_count", (("model", MODEL),))
    itl = ("trtllm_kit_openai_inter_token_latency_seconds_count", (("model", MODEL),))
    client.completions.create(model=MODEL, prompt="one two", max_tokens=4)
    list(client.completions.create(model=MODEL, prompt="one two", max_tokens=3, stream=True))
    assert post(server, "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 0})[0] == 400
    after = scrape(server)

    def delta(key: tuple) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta(("trtllm_kit_openai_requests_total", ok)) == 2
    assert delta(("trtllm_kit_openai_requests_total", bad)) == 1
    assert delta(("trtllm_kit_openai_errors_total", bad)) == 1 and delta(("trtllm_kit_openai_errors_total", ok)) == 0
    assert delta(ttft) == 2 and delta(itl) == 3 + 2  # one first piece per request, the others are gaps


def test_api_key_is_enforced(server: dict[str, Any]) -> None:
    status, body = post(server, "/v1/completions", {"model": MODEL, "prompt": "x"}, key=None)
    assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"http://{server['openai']}/v1", api_key="wrong", max_retries=0).models.list()


def test_bench_sends_the_api_key_and_never_writes_it(server: dict[str, Any], fake_out: Path, tmp_path: Path) -> None:
    args = ["bench", "--openai-url", f"http://{server['openai']}/v1", "--tokenizer", str(fake_out / "tokenizer"),
            "--concurrency", "2", "--requests", "4", "--isl", "8", "--osl", "4", "--warmup", "0", "--no-plots",
            "--max-client-lag", "1000", "--metrics-url", f"http://{server['metrics']}/metrics"]
    refused = kit(*args, "--out", str(tmp_path / "refused"), env={k: v for k, v in os.environ.items()
                                                                  if k != "TRTLLM_KIT_API_KEY"})
    assert (refused.returncode, refused.stderr.splitlines()[-1]) == (2, (
        f"Error: http://{server['openai']}/v1/models answers 401: the server wants an API key; pass --api-key KEY "
        "(or set TRTLLM_KIT_API_KEY)."))
    done = kit(*args, "--api-key", KEY, "--out", str(tmp_path / "res"))
    assert done.returncode == 0, done.stderr
    assert all(KEY not in path.read_text() for path in (tmp_path / "res").iterdir())


def triton_token(server: dict[str, Any]) -> dict[str, str]:
    """The gRPC header a keyed server's Triton demands (the per-launch token, in the owner's run directory)."""
    return {GRPC_RESTRICTED_HEADER: (Path(server["run_dir"]) / TOKEN_FILE).read_text()}


def test_generate_cli_and_tritonclient(server: dict[str, Any]) -> None:
    done = kit("generate", "hello", "--url", server["grpc"], "--max-tokens", "4")  # the owner's: with the token
    assert done.returncode == 0 and done.stdout.strip(), done.stderr
    cmdline = Path(f"/proc/{server['server_pid']}/cmdline").read_bytes().decode()
    assert triton_token(server)[GRPC_RESTRICTED_HEADER] not in cmdline and "trtllm-kit-token=<hidden>" in cmdline
    with grpcclient.InferenceServerClient(server["grpc"]) as triton:
        assert triton.is_model_ready("ensemble")  # health stays open
        with pytest.raises(InferenceServerException, match="This protocol is restricted"):
            triton.get_model_metadata("ensemble")  # with --api-key, every other protocol demands the token


def test_a_second_serve_of_the_same_out_is_refused(server: dict[str, Any], fake_out: Path) -> None:
    done = kit("serve", str(fake_out), "--http-port", str(free_port()))
    assert (done.returncode, done.stderr) == (2, f"Error: {fake_out} is already served by pid {server['pid']}; run "
                                                 f"trtllm-kit stop {fake_out}.\n")


def test_sigterm_during_a_stream_finishes_it_then_leaves_nothing(server: dict[str, Any], fake_out: Path) -> None:
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server["grpc"])
    client.start_stream(callback=lambda result, error: responses.put((result, error)), headers=triton_token(server))
    inputs = [grpcclient.InferInput("text_input", [1, 1], "BYTES"),
              grpcclient.InferInput("max_tokens", [1, 1], "INT32")]
    inputs[0].set_data_from_numpy(np.array([[b"slow"]], dtype=np.object_))
    inputs[1].set_data_from_numpy(np.array([[40]], dtype=np.int32))
    client.async_stream_infer("ensemble", inputs, enable_empty_final_response=True)
    words = []
    while True:
        result, error = responses.get(timeout=30)
        assert error is None
        if result.as_numpy("text_output") is not None:
            words.append(result.as_numpy("text_output").reshape(-1)[0])
        if len(words) == 1:  # SIGTERM (via stop) with 2 s of the stream left, less than the server's exit timeout
            # without OUT, stop ends the serve last started with --detach: this one
            stop = subprocess.Popen([*KIT, "stop"], stdout=subprocess.PIPE, text=True)
        if result.get_response().parameters["triton_final_response"].bool_param:
            break
    client.stop_stream()
    client.close()
    assert words == [f" w{i}".encode() for i in range(40)]  # the stream in flight was finished, not cut
    assert stop.wait(timeout=60) == 0 and stop.stdout.read() == f"stopped pid {server['pid']}\n"
    for pid in [server["pid"], server["server_pid"], *server["stub_pids"]]:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert server["stub_pids"] and not list(Path("/dev/shm").glob(f"{server['shm_prefix']}*"))
    assert read_state(fake_out) is None and not (run_dir(fake_out) / "serve.pid").exists()
    again = kit("stop")  # nothing to stop is not a failure (issue 16, item 6)
    assert (again.returncode, again.stdout) == (0, f"nothing to stop: no trtllm-kit serve of {fake_out.absolute()} "
                                                   "is running\n")
