"""LoRA through a real ``trtllm-kit serve`` of a cpu build with two PEFT adapters, its OpenAI frontend and gateway:
the ``model`` field names an adapter (vLLM's convention); the base and both adapters, in one batch, equal PEFT;
unknown names are 404s; with a cache of one adapter, evictions are invisible to clients (the frontend resends the
weights); adapters load and unload on the running server (admin key only); a key limited to an adapter; usage and
metrics per adapter; the BLS passes the LoRA inputs on; a reload serves the new version's adapters."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from kit_server import KitServer
from prometheus_client.parser import text_string_to_metric_families
from transformers import AutoTokenizer

from tests.lora.adapters import MAX_RANK, make_adapter, one_adapter_bytes, peft_greedy
from trtllm_kit.cli import run
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.runtime.lora import ADAPTER_FILE, load_adapter, to_rows
from trtllm_kit.serve.client import TextClient
from trtllm_kit.serve.gateway.keys import add_key
from trtllm_kit.serve.server.launcher import grpc_headers
from trtllm_kit.serve.server.state import read_state, token_for
from trtllm_kit.serve.service import stop_serving
from trtllm_kit.wire import GenerationRequest, LoraAdapter

pytestmark = [pytest.mark.integration, pytest.mark.slow]
MODEL = "builtin:tiny-llama"
PROMPT = [5, 77, 301, 9, 640, 12, 18, 999, 3]
MAX_TOKENS = 8
ADAPTERS = {"qv4": (4, 8, ["q_proj", "v_proj"]), "mlp16": (16, 32, ["o_proj", "gate_proj", "up_proj", "down_proj"]),
            "late": (8, 16, ["k_proj", "down_proj"]), "wide": (32, 32, ["q_proj"])}  # late: loaded; wide: over-rank


@dataclass
class Served:
    out: Path
    url: str
    sources: dict[str, Path]
    secrets: dict[str, str]
    keys_path: Path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("lora-serve")
    sources = {name: make_adapter(builtin_dir("tiny-llama"), root / name, rank=rank, targets=targets, alpha=alpha,
                                  seed=seed) for seed, (name, (rank, alpha, targets)) in enumerate(ADAPTERS.items())}
    out = root / "out"
    assert run(["build", MODEL, "--target", "cpu", "--dtype", "float32", "--no-verify", "--instances", "1",
                "--max-lora-rank", str(MAX_RANK), "--lora", f"qv4={sources['qv4']}", "--lora",
                f"mlp16={sources['mlp16']}", "--lora-cache-host-memory-bytes",
                str(one_adapter_bytes(builtin_dir("tiny-llama"))), "--out", str(out)]) == 0  # a cache of 1
    keys_path = root / "keys.json"
    limits: dict[str, dict[str, Any]] = {"ops": {"admin": True}, "user": {}, "qv4-only": {"models": (MODEL, "qv4")}}
    secrets = {name: add_key(keys_path, name, **values)[0] for name, values in limits.items()}
    server = KitServer(out, api_keys=keys_path).start()  # its own: it loads adapters, edits keys and reloads
    yield Served(out, server.url, sources, secrets, keys_path)
    if read_state(out) is not None:
        stop_serving(out, 30)


def peft_tokens(source: Path | None, prompt: list[int] = PROMPT) -> list[int]:
    return peft_greedy(builtin_dir("tiny-llama"), source, prompt, MAX_TOKENS)


def call(served: Served, path: str, key: str, body: dict[str, Any] | None = None) -> tuple[int, str]:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {served.secrets[key]}"}
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(served.url + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def tokens(served: Served, model: str, key: str = "user") -> list[int] | tuple[int, dict[str, Any]]:
    """The greedy token ids the OpenAI API streams for ``model``, or (status, error body) when refused."""
    status, text = call(served, "/v1/completions", key, {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS,
                                                         "temperature": 0, "ignore_eos": True, "stream": True})
    if status != 200:
        return status, json.loads(text)
    events = [json.loads(e[len("data: "):]) for e in text.split("\n\n") if e and e != "data: [DONE]"]
    assert all(e["model"] == model for e in events)
    return [t for e in events for t in e["choices"][0].get("token_ids", []) if e["choices"]]


def metric(served: Served, family: str, **labels: str) -> float:
    with urllib.request.urlopen(served.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == family and all(s.labels.get(k) == v for k, v in labels.items()))


def test_adapters_by_name_in_one_batch_equal_peft_and_unknown_is_404(served: Served) -> None:
    expected = {MODEL: peft_tokens(None), "qv4": peft_tokens(served.sources["qv4"]),
                "mlp16": peft_tokens(served.sources["mlp16"])}
    assert len({tuple(t) for t in expected.values()}) == len(expected)  # each adapter changes the output
    status, text = call(served, "/v1/models", "user")
    cards = {c["id"]: c for c in json.loads(text)["data"]}
    assert status == 200 and set(cards) == {MODEL, "qv4", "mlp16"}
    assert {k: cards["qv4"][k] for k in ("parent", "root")} == {"parent": MODEL,
                                                                 "root": str(served.sources["qv4"].resolve())}
    with ThreadPoolExecutor(len(expected)) as pool:  # the base and both adapters in one batch
        got = dict(zip(expected, pool.map(lambda m: tokens(served, m), expected), strict=True))
    assert got == expected
    status, error = tokens(served, "nope")
    assert status == 404 and error["error"]["code"] == "model_not_found" and "'nope'" in error["error"]["message"]
    # the cache holds 1 adapter: each request below evicts the other's, and the frontend resends it unseen
    assert [tokens(served, m) for m in ("qv4", "mlp16", "qv4")] == [expected["qv4"], expected["mlp16"],
                                                                    expected["qv4"]]
    assert metric(served, "trtllm_kit_openai_lora_uploads_total", model="qv4", reason="evicted") >= 1
    assert metric(served, "trtllm_kit_openai_requests_total", model="mlp16", status="200") >= 2


def test_load_and_unload_on_the_running_server(served: Served, capsys: pytest.CaptureFixture[str]) -> None:
    late = {"lora_name": "late", "lora_path": str(served.sources["late"])}
    status, text = call(served, "/v1/load_lora_adapter", "user", late)
    assert status == 403 and json.loads(text)["error"]["type"] == "permission_error"
    admin = ["--url", served.url, "--api-key", served.secrets["ops"]]
    assert run(["lora", "load", *admin, "wide", str(served.sources["wide"])]) == 2
    assert "rank 32, above the artifact's max_lora_rank 16" in capsys.readouterr().err
    assert run(["lora", "load", *admin, "late", str(served.sources["late"])]) == 0
    assert tokens(served, "late") == peft_tokens(served.sources["late"])
    assert run(["lora", "unload", str(served.out), "late", "--api-key", served.secrets["ops"]]) == 0  # the serve of OUT
    status, error = tokens(served, "late")
    assert status == 404 and error["error"]["code"] == "model_not_found"
    assert run(["lora", "unload", *admin, "late"]) == 2


def test_key_limited_to_an_adapter_and_usage_per_adapter(served: Served) -> None:
    assert isinstance(tokens(served, "qv4", key="qv4-only"), list)
    status, error = tokens(served, "mlp16", key="qv4-only")
    assert status == 403 and error["error"]["code"] == "model_not_allowed"
    usage = [json.loads(line) for line in served.keys_path.with_name("keys.json.usage.jsonl").read_text().splitlines()]
    assert any(u["key"] == "qv4-only" and u["model"] == "qv4" and u["completion_tokens"] == MAX_TOKENS
               for u in usage)
    assert metric(served, "trtllm_kit_gateway_tokens_total", model="qv4", kind="completion") >= MAX_TOKENS


def test_the_bls_passes_the_lora_inputs_through(served: Served) -> None:
    """Text without the frontend's tokenizer goes to the BLS, which hands the LoRA inputs to tensorrt_llm."""
    state = read_state(served.out)
    assert state is not None
    adapter_dir = served.out / "lora" / "mlp16"
    weights, config = to_rows(load_adapter(adapter_dir / ADAPTER_FILE, torch.float32, 1 << 30))
    lora = LoraAdapter("mlp16", 99, weights.numpy(), config.numpy())
    text = "The kit serves adapters"
    gen = GenerationRequest(text, max_tokens=MAX_TOKENS, temperature=0.0, end_id=-1, lora=lora)

    async def generate() -> str:
        client = TextClient(state["grpc"], "tensorrt_llm_bls", grpc_headers(token_for(state["grpc"])))
        try:
            return "".join([chunk.text async for chunk in client.stream(gen)])
        finally:
            await client.close()

    tokenizer = AutoTokenizer.from_pretrained(builtin_dir("tiny-llama"))
    expected = peft_tokens(served.sources["mlp16"], tokenizer(text).input_ids)
    assert expected != peft_tokens(None, tokenizer(text).input_ids)
    assert asyncio.run(generate()) == tokenizer.decode(expected, skip_special_tokens=True)


def test_a_reload_serves_the_new_versions_adapters(served: Served) -> None:
    """Runs last: the reloaded version has only ``late``; ``qv4`` and ``mlp16`` go with the old version."""
    new_out = served.out.with_name("out-v2")
    assert run(["build", MODEL, "--target", "cpu", "--dtype", "float32", "--no-verify", "--instances", "1",
                "--max-lora-rank", str(MAX_RANK), "--lora", f"late={served.sources['late']}", "--out",
                str(new_out)]) == 0
    assert run(["reload", MODEL, str(new_out), "--out", str(served.out)]) == 0
    status, text = call(served, "/v1/models", "user")
    cards = {c["id"]: c for c in json.loads(text)["data"]}
    assert status == 200 and set(cards) == {MODEL, "late"} and cards["late"]["parent"] == MODEL
    assert tokens(served, "late") == peft_tokens(served.sources["late"])
    assert tokens(served, "qv4")[0] == 404
