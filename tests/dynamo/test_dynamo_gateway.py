"""The kit's OpenAI frontend and gateway in front of ``serve --dynamo``, with real Dynamo: keys, quotas and usage
hold, unknown names are refused with their name, the workers' refusals reach the client in their sentence, and the
answers (whole and streamed) are Dynamo's own."""

from __future__ import annotations

import functools
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from dynamo_installed import HAS_DYNAMO
from kit_server import BuildKey, Builds, KitServer

from trtllm_kit.serve.dynamo.frontend_client import completion_body, dynamo_request_id, refusal
from trtllm_kit.serve.dynamo.launch import serve_net
from trtllm_kit.serve.gateway.keys import add_key
from trtllm_kit.serve.openai.text import Tokenizer
from trtllm_kit.wire import GenerationRequest, LoraAdapter
from trtllm_kit.wire.request import NEVER_END_ID

pytestmark = [pytest.mark.integration, pytest.mark.slow]
LLMAPI = BuildKey.of(target="llmapi")
PROMPT_IDS = [1, 264, 333, 84, 534, 332]
KEYS = {"open": {}, "small": {"quota_tokens": 10, "quota_period": "day"}}
GUIDE_REFUSAL = "sampling_options.guided_decoding.choice is set; the CPU runtime guides by json, regex or grammar only."


@dataclass
class Gated:
    server: KitServer
    keys_path: Path
    secrets: dict[str, str]

    @property
    def model(self) -> str:
        return str(self.server.state["model"])

    def post(self, path: str, body: dict[str, Any], key: str | None = "open", *,
             url: str | None = None) -> tuple[int, bytes]:
        """POST ``body`` to the gateway (or to ``url``) with ``key``'s secret (None: no key)."""
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Authorization"] = f"Bearer {self.secrets.get(key, key)}"
        request = urllib.request.Request(f"{url or self.server.url}{path}", data=json.dumps(body).encode(),
                                         headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def post_to_dynamo(self, body: dict[str, Any]) -> tuple[int, bytes]:
        """POST ``body`` to Dynamo's own frontend's /v1/completions, keyless, from inside the serve's network
        namespace (the only place it answers)."""
        net = serve_net(Path(self.server.state["run_dir"]) / "dynamo")
        try:
            return net.call(functools.partial(self.post, "/v1/completions", body, None,
                                              url=f"http://{self.server.state['dynamo_frontend']}"))
        finally:
            net.close()

    def usage(self, key: str) -> list[dict[str, Any]]:
        path = self.keys_path.with_name(self.keys_path.name + ".usage.jsonl")
        lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        return [line for line in lines if line["key"] == key]


@pytest.fixture(scope="module")
def gated(kit_builds: Builds, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gated]:
    if not HAS_DYNAMO:
        pytest.skip("NVIDIA Dynamo is not installed (pip install -e '.[dynamo]' and the ai-dynamo wheel with "
                    "--no-deps, as .ci/run does).")
    root = tmp_path_factory.mktemp("dynamo-gateway")
    out, keys_path = kit_builds.copy(LLMAPI, root / "out"), root / "keys.json"
    secrets = {name: add_key(keys_path, name, **limits)[0] for name, limits in KEYS.items()}
    with KitServer(out, dynamo=True, workers=1, api_keys=keys_path) as server:
        yield Gated(server, keys_path, secrets)


def _events(raw: bytes) -> list[dict[str, Any]]:
    lines = [line.strip() for line in raw.decode().splitlines()]
    return [json.loads(line.removeprefix("data:")) for line in lines
            if line.startswith("data:") and line != "data: [DONE]"]


def test_the_gateway_is_the_only_public_port(gated: Gated) -> None:
    state = gated.server.state
    host, port = state["dynamo_frontend"].rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) != gated.server.port
    assert state["openai"].endswith(f":{gated.server.port}")


@pytest.mark.parametrize("key", [None, "sk-kit-wrong"])
def test_a_missing_or_wrong_key_is_refused(gated: Gated, key: str | None) -> None:
    status, raw = gated.post("/v1/completions", {"model": gated.model, "prompt": PROMPT_IDS, "max_tokens": 2}, key)
    assert (status, json.loads(raw)["error"]["code"]) == (401, "invalid_api_key")


def test_an_exhausted_quota_is_refused_with_429(gated: Gated) -> None:
    body = {"model": gated.model, "prompt": PROMPT_IDS, "max_tokens": 8, "ignore_eos": True}
    first, _ = gated.post("/v1/completions", body, "small")  # reserves 6 + 8 of 10: admitted, settles 14
    second, raw = gated.post("/v1/completions", body, "small")
    assert (first, second) == (200, 429)
    assert json.loads(raw)["error"]["code"] == "quota_exceeded"
    assert sum(line["prompt_tokens"] + line["completion_tokens"] for line in gated.usage("small")) == 14


def test_usage_is_counted_per_key(gated: Gated) -> None:
    before = len(gated.usage("open"))
    body = {"model": gated.model, "prompt": PROMPT_IDS, "max_tokens": 5, "ignore_eos": True}
    status, raw = gated.post("/v1/completions", body)
    assert status == 200, raw
    assert json.loads(raw)["usage"] == {"prompt_tokens": 6, "completion_tokens": 5, "total_tokens": 11}
    logged = gated.usage("open")[before:]
    assert [(line["model"], line["prompt_tokens"], line["completion_tokens"]) for line in logged] == [
        (gated.model, 6, 5)]


def test_an_unknown_model_is_refused_with_its_name(gated: Gated) -> None:
    status, raw = gated.post("/v1/completions", {"model": "no-such-model", "prompt": "hi", "max_tokens": 2})
    error = json.loads(raw)["error"]
    assert (status, error["code"]) == (404, "model_not_found")
    assert "'no-such-model'" in error["message"] and repr(gated.model) in error["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_worker_refusal_reaches_the_client_in_its_sentence(gated: Gated, stream: bool) -> None:
    body = {"model": gated.model, "prompt": "hi", "max_tokens": 4, "guided_choice": ["yes", "no"], "stream": stream}
    status, raw = gated.post("/v1/completions", body)
    assert status == 400, raw
    assert json.loads(raw)["error"]["message"] == GUIDE_REFUSAL


@pytest.mark.parametrize("prompt", [PROMPT_IDS, "The capital of France is"])
def test_greedy_answers_through_the_gateway_equal_dynamos_own(gated: Gated, prompt: list[int] | str) -> None:
    body = {"model": gated.model, "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    ours_status, ours = gated.post("/v1/completions", body)
    # a text prompt is tokenized by the kit as a plain serve does (BOS included; Dynamo's frontend adds none)
    sent = list(Tokenizer(gated.server.out / "tokenizer").encode(prompt)) if isinstance(prompt, str) else prompt
    theirs_status, theirs = gated.post_to_dynamo({**body, "prompt": sent})
    assert (ours_status, theirs_status) == (200, 200), (ours, theirs)
    ours_json, theirs_json = json.loads(ours), json.loads(theirs)
    assert ours_json["choices"][0]["text"] == theirs_json["choices"][0]["text"] != ""
    assert ours_json["usage"] == theirs_json["usage"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_chat_answer_is_dynamos_answer_to_the_kits_template(gated: Gated, stream: bool) -> None:
    messages = [{"role": "user", "content": "Name a colour."}]
    body = {"model": gated.model, "messages": messages, "max_tokens": 8, "temperature": 0, "ignore_eos": True,
            "stream": stream}
    status, raw = gated.post("/v1/chat/completions", body)
    assert status == 200, raw
    if stream:
        content = "".join(choice["delta"].get("content") or "" for event in _events(raw)
                          for choice in event["choices"])
    else:
        content = json.loads(raw)["choices"][0]["message"]["content"]
    tokenizer = Tokenizer(gated.server.out / "tokenizer")
    ids = list(tokenizer.encode(tokenizer.chat_prompt(messages)))
    theirs_status, theirs = gated.post_to_dynamo({"model": gated.model, "prompt": ids, "max_tokens": 8,
                                                  "temperature": 0, "ignore_eos": True})
    assert theirs_status == 200, theirs
    assert content == json.loads(theirs)["choices"][0]["text"] != ""


def test_streaming_through_the_gateway(gated: Gated) -> None:
    body = {"model": gated.model, "prompt": PROMPT_IDS, "max_tokens": 10, "temperature": 0, "ignore_eos": True}
    whole_status, whole = gated.post("/v1/completions", body)
    status, raw = gated.post("/v1/completions", {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert (whole_status, status) == (200, 200)
    events = _events(raw)
    texts = [choice["text"] for event in events for choice in event["choices"]]
    assert sum(1 for text in texts if text) > 1  # streamed, not one whole chunk
    assert "".join(texts) == json.loads(whole)["choices"][0]["text"]
    assert events[-1]["usage"] == {"prompt_tokens": 6, "completion_tokens": 10, "total_tokens": 16}


def test_a_workers_log_names_the_request_the_client_saw(gated: Gated) -> None:
    status, raw = gated.post("/v1/completions", {"model": gated.model, "prompt": PROMPT_IDS, "max_tokens": 2})
    assert status == 200, raw
    request_id = json.loads(raw)["id"].split("-", 1)[1]
    log = Path(gated.server.state["workers"]["worker-0"]["log"])
    deadline = time.monotonic() + 10
    while f"request_id={request_id}" not in log.read_text(errors="replace") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert f"request_id={request_id}" in log.read_text(errors="replace")


def test_metrics_carry_the_gateways_series_and_dynamos(gated: Gated) -> None:
    with urllib.request.urlopen(f"{gated.server.url}/metrics", timeout=30) as response:
        text = response.read().decode()
    assert "trtllm_kit_gateway_requests_total" in text and "dynamo_frontend_" in text


@pytest.mark.skipif(not HAS_DYNAMO, reason="NVIDIA Dynamo is not installed.")
def test_a_single_api_key_is_required(kit_builds: Builds, tmp_path: Path) -> None:
    out = kit_builds.copy(LLMAPI, tmp_path / "out")
    with KitServer(out, dynamo=True, workers=1, api_key="single-secret") as server:
        body = json.dumps({"model": server.state["model"], "prompt": PROMPT_IDS, "max_tokens": 2}).encode()
        refused, _, raw = server.post("/v1/completions", body, {"Authorization": "Bearer wrong"})
        answered, _, _ = server.post("/v1/completions", body)  # with the serve's key
    assert (refused, json.loads(raw)["error"]["code"], answered) == (401, "invalid_api_key", 200)


@pytest.mark.parametrize("fields, sentence", [
    ({"lora": LoraAdapter("sql")}, "the adapter 'sql' cannot run on serve --dynamo's workers, which serve the "
                                   "base model alone; name the base model, or serve the adapter without --dynamo."),
    ({"n": 2}, "n is 2 and best_of None; serve --dynamo's workers answer one choice per token-id prompt: send n=1 "
               "and no best_of, or the prompt as text."),
    ({"prompt_logprobs": 1}, "prompt_logprobs is 1 without logprobs; serve --dynamo's workers score a prompt only "
                             "with its answer: set logprobs too, or serve without --dynamo."),
    ({"length_penalty": 0.5}, "beam_width is None and length_penalty 0.5; serve --dynamo's workers decode without "
                              "beams: leave beam_width and length_penalty out."),
    ({"beam_width": 2}, "beam_width is 2 and length_penalty None; serve --dynamo's workers decode without beams: "
                        "leave beam_width and length_penalty out."),
])
def test_what_the_workers_cannot_do_is_refused_before_it_is_sent(fields: dict[str, Any], sentence: str) -> None:
    assert refusal(GenerationRequest((1, 2, 3), 4, **fields)) == sentence
    assert refusal(GenerationRequest((1, 2, 3), 4)) is None


def test_the_completion_request_dynamo_is_sent() -> None:
    req = GenerationRequest((1, 2, 3), 4, top_k=1, seed=5, end_id=NEVER_END_ID, guide=("json_schema", '{"a": 1}'))
    assert completion_body("tiny", req) == {
        "model": "tiny", "prompt": [1, 2, 3], "stream": True, "max_tokens": 4, "top_k": 1, "seed": 5,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}, "ignore_eos": True,
        "guided_json": {"a": 1}}


@pytest.mark.parametrize("request_id, expected", [
    ("cmpl-5f0e7c4e11114222833344445555aaaa", "5f0e7c4e11114222833344445555aaaa"),
    ("chatcmpl-5f0e7c4e11114222833344445555aaaa", "5f0e7c4e11114222833344445555aaaa"),
    ("cmpl-5f0e7c4e11114222833344445555aaaa-0-1", None), ("", None)])
def test_the_request_id_dynamo_is_given(request_id: str, expected: str | None) -> None:
    assert dynamo_request_id(request_id) == expected
