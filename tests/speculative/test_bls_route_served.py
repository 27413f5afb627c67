"""The BLS route of an engine draft-target artifact, served for real on a CPU: a cpu-target draft-target build has the
same ``tensorrt_llm_bls`` and ``tensorrt_llm_draft`` as the engine target's, so the route the frontend chooses for the
engine target (``bls_num_draft_tokens("engine", ...)`` of this build's ``[speculative]`` table) is put in front of its
running tritonserver beside the serve's own frontend (the direct route). Whole and streamed, completions and chat,
the BLS route answers the direct route's greedy text, its requests run on ``tensorrt_llm_bls`` and draft on
``tensorrt_llm_draft`` (Triton's request counters), ``usage.speculative`` counts the BLS's rounds, and what the BLS
cannot answer is refused in one sentence."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from kit_server import KitServer
from prometheus_client.parser import text_string_to_metric_families

from trtllm_kit.artifact import Artifact
from trtllm_kit.cli import run
from trtllm_kit.enums import Target
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.names import BLS_MODEL, DRAFT_MODEL
from trtllm_kit.serve.frontend import start_frontend
from trtllm_kit.serve.openai.app import OpenAIApp
from trtllm_kit.serve.openai.bls_route import bls_num_draft_tokens
from trtllm_kit.serve.openai.config import OpenAIConfig
from trtllm_kit.serve.openai.routes import Route
from trtllm_kit.serve.server.launcher import free_port, grpc_headers
from trtllm_kit.serve.server.state import TOKEN_FILE

pytestmark = [pytest.mark.integration, pytest.mark.slow]
MODEL, DRAFT = "builtin:tiny-llama", "tiny-qwen2"  # two families, one tokenizer
PROMPTS = ["The quick brown fox", "Once upon a time, in a land far away,"]
MAX_TOKENS, K = 12, 3
WHY = "this model speculates through tensorrt_llm_bls (draft-target on a TensorRT-LLM engine)"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KitServer]:
    out = tmp_path_factory.mktemp("bls-route") / "out"
    assert run(["build", MODEL, "--target", "cpu", "--dtype", "float32", "--no-verify", "--speculative",
                "draft-target", "--draft-model", str(builtin_dir(DRAFT)), "--max-draft-len", str(K),
                "--out", str(out)]) == 0
    with KitServer(out) as server:
        yield server


@pytest.fixture(scope="module")
def bls_url(served: KitServer) -> Iterator[str]:
    """A frontend serving the build through the route the engine target gets, on a loop of its own."""
    artifact = Artifact.read(served.out)
    assert bls_num_draft_tokens(artifact.target, artifact.spec.speculative) is None  # cpu: the direct route
    num_draft_tokens = bls_num_draft_tokens(Target.ENGINE.value, artifact.spec.speculative)
    assert num_draft_tokens == K
    route = Route(MODEL, BLS_MODEL, tokenizer_dir=served.out / "tokenizer",
                  models=(BLS_MODEL, "tensorrt_llm", DRAFT_MODEL, "preprocessing", "postprocessing"),
                  num_draft_tokens=num_draft_tokens)
    token = (Path(served.state["run_dir"]) / TOKEN_FILE).read_text()
    config = OpenAIConfig(grpc_url=served.grpc, served_name=MODEL, triton_model=BLS_MODEL,
                          triton_headers=grpc_headers(token), routes=(route,))
    app, port = OpenAIApp(config), free_port()
    loop = asyncio.new_event_loop()
    runner = loop.run_until_complete(start_frontend(app, "127.0.0.1", port))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=300.0)


def request_counts(served: KitServer) -> dict[str, float]:
    """Triton's successful requests by model."""
    with urllib.request.urlopen(f"http://{served.metrics}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {sample.labels["model"]: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name in ("nv_inference_request_success",
                                                            "nv_inference_request_success_total")}


def completion(url: str, prompt: str, stream: bool, **fields: Any) -> tuple[list[str], dict[str, Any]]:
    """Each choice's text and the usage (as a dict, its ``speculative`` extension included)."""
    if not stream:
        answer = client(url).completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                                **fields)
        assert answer.usage is not None
        return [c.text for c in sorted(answer.choices, key=lambda c: c.index)], answer.usage.model_dump()
    chunks = list(client(url).completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}, **fields))
    texts = [""] * (fields.get("n") or 1)
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    usage = chunks[-1].usage
    assert usage is not None
    return texts, usage.model_dump()


@pytest.mark.parametrize("stream", [False, True])
def test_the_bls_route_answers_the_direct_routes_greedy_text_and_counts_its_rounds(
        served: KitServer, bls_url: str, stream: bool) -> None:
    for prompt in PROMPTS:
        direct_texts, direct_usage = completion(served.url, prompt, stream)
        before = request_counts(served)
        texts, usage = completion(bls_url, prompt, stream)
        after = request_counts(served)
        assert texts == direct_texts, prompt
        assert (usage["prompt_tokens"], usage["completion_tokens"]) == \
            (direct_usage["prompt_tokens"], direct_usage["completion_tokens"])
        speculative = usage["speculative"]
        drafts, drafted, accepted = (speculative[k] for k in ("drafts", "draft_tokens", "accepted_tokens"))
        assert drafts > 0 and drafted <= K * drafts and 0 <= accepted <= drafted
        assert speculative["acceptance_length"] == round(1 + accepted / drafts, 4)
        assert after[BLS_MODEL] - before.get(BLS_MODEL, 0.0) == 1  # one request to the BLS
        assert after[DRAFT_MODEL] - before.get(DRAFT_MODEL, 0.0) == drafts  # one draft call per round with a draft


def test_n_choices_are_n_bls_requests(served: KitServer, bls_url: str) -> None:
    (direct,), _ = completion(served.url, PROMPTS[0], False)
    before = request_counts(served)
    texts, usage = completion(bls_url, PROMPTS[0], False, n=2)
    assert texts == [direct, direct]
    assert request_counts(served)[BLS_MODEL] - before[BLS_MODEL] == 2
    assert usage["speculative"]["drafts"] > 0


def test_chat_through_the_bls_route_answers_the_direct_routes_text(served: KitServer, bls_url: str) -> None:
    def chat(url: str) -> str | None:
        answer = client(url).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": PROMPTS[1]}], max_tokens=MAX_TOKENS, temperature=0)
        return answer.choices[0].message.content

    assert chat(bls_url) == chat(served.url)


def post(url: str, body: dict[str, Any], path: str = "/v1/completions") -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(f"{url}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


REFUSED = [
    ("/v1/completions", {"prompt": [1, 50, 60]}, "prompt",
     f"prompt is token ids, and {WHY}, which takes text; send the prompt as text."),
    ("/v1/completions", {"prompt": PROMPTS[0], "logprobs": 2}, "logprobs",
     f"logprobs is 2, and {WHY}, whose rounds return no log probabilities; leave logprobs out."),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True}, "logprobs",
     f"logprobs is true, and {WHY}, whose rounds return no log probabilities; leave logprobs out."),
    ("/v1/completions", {"prompt": PROMPTS[0], "best_of": 2}, "best_of",
     f"best_of is 2, and {WHY}, whose rounds return no log probabilities to rank sequences by; leave best_of out."),
    ("/v1/completions", {"prompt": PROMPTS[0], "guided_regex": "[a-z]+"}, "guided_regex",
     f"guided_regex asks for structured output, and {WHY}, whose text interface takes no guide; leave guided_regex "
     "out."),
]


@pytest.mark.parametrize(("path", "fields", "param", "message"), REFUSED,
                         ids=["token-ids", "logprobs", "chat-logprobs", "best_of", "guided_regex"])
def test_what_the_bls_cannot_answer_is_refused_in_one_sentence(served: KitServer, bls_url: str, path: str,
                                                                fields: dict[str, Any], param: str,
                                                                message: str) -> None:
    status, body = post(bls_url, {"model": MODEL, "max_tokens": 4, **fields}, path)
    assert status == 400
    assert (body["error"]["param"], body["error"]["message"]) == (param, message)
    direct_status, _ = post(served.url, {"model": MODEL, "max_tokens": 4, **fields}, path)
    assert direct_status == 200  # the direct route answers it
