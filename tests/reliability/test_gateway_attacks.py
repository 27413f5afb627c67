"""The gateway attacked as a hostile client would, in front of a real served tiny model (``serve --api-keys``): a
body whose Content-Type declares another charset cannot pass a model restriction or a quota; a burst of
concurrent requests cannot overshoot a quota or a tokens-per-minute limit by more than one request's reservation;
``/metrics`` names no key without the admin key; malformed requests get OpenAI's JSON errors."""

from __future__ import annotations

import http.client
import json
import shutil
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from reliability_helpers import kit
from serving_helpers import MODEL, open_stream, post, serve

from trtllm_kit.serve.gateway.keys import add_key
from trtllm_kit.serve.openai.request_limits import MAX_BODY_BYTES

pytestmark = [pytest.mark.integration, pytest.mark.slow]
PROMPT = [5, 6, 7]  # token ids: 3 prompt tokens
QUOTA, TPM = 30, 20
KEYS = {"elsewhere": {"models": ("another",)}, "charset_quota": {"quota_tokens": QUOTA, "quota_period": "day"},
        "burst_small": {"quota_tokens": QUOTA, "quota_period": "day"},
        "burst_large": {"quota_tokens": QUOTA, "quota_period": "day"}, "tpm_small": {"tpm": TPM},
        "tpm_large": {"tpm": TPM}, "open": {"tenant": "acme"}, "ops": {"admin": True},
        "leaver_stream": {"quota_tokens": 500, "quota_period": "day"},
        "leaver_whole": {"quota_tokens": 500, "quota_period": "day"}}


@dataclass
class Gated:
    state: dict[str, Any]
    keys_path: Path
    secrets: dict[str, str]

    @property
    def url(self) -> str:
        return f"http://{self.state['openai']}/v1/completions"

    def usage(self, key: str) -> list[dict[str, Any]]:
        """The usage log's lines of ``key``."""
        path = self.keys_path.with_name(self.keys_path.name + ".usage.jsonl")
        lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        return [line for line in lines if line["key"] == key]

    def triton_inferences(self) -> float:
        """Triton's count of requests the ``tensorrt_llm`` model received (succeeded or failed)."""
        return sum(value for (name, labels), value in scrape(f"http://{self.state['metrics']}/metrics").items()
                   if name in ("nv_inference_request_success_total", "nv_inference_request_failure_total")
                   and ("model", "tensorrt_llm") in labels)


@pytest.fixture(scope="module")
def gated(tiny_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gated]:
    root = tmp_path_factory.mktemp("gated")
    out, keys_path = root / "out", root / "keys.json"
    shutil.copytree(tiny_artifact, out)
    secrets = {name: add_key(keys_path, name, **limits)[0] for name, limits in KEYS.items()}
    state = serve(out, api_keys=keys_path)
    yield Gated(state, keys_path, secrets)
    kit("stop", str(out), timeout=60)


def scrape(url: str, key: str | None = None) -> dict[tuple[str, tuple], float]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def body(max_tokens: int, model: str = MODEL) -> bytes:
    return json.dumps({"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True}).encode()


def complete(gated: Gated, key: str, payload: bytes, content_type: str = "application/json") -> tuple[int, dict]:
    status, _, answer = post(gated.url, payload, {"Authorization": f"Bearer {gated.secrets[key]}",
                                                  "Content-Type": content_type})
    return status, json.loads(answer)


@pytest.mark.parametrize("charset", ["utf-16", "cp500", "bogus", "UTF-16LE"])
def test_a_declared_charset_passes_neither_a_model_restriction_nor_a_quota(gated: Gated, charset: str) -> None:
    before = gated.triton_inferences()
    content_type = f"application/json; charset={charset}"
    for payload in (body(4), body(4).decode().encode("utf-16")):
        status, answer = complete(gated, "elsewhere", payload, content_type)
        assert (status, answer["error"]["code"]) == (415, "unsupported_media_type")
    statuses = [complete(gated, "charset_quota", body(50), content_type)[0] for _ in range(8)]
    assert statuses == [415] * 8
    assert gated.triton_inferences() == before
    assert gated.usage("charset_quota") == [] and gated.usage("elsewhere") == []
    assert complete(gated, "elsewhere", body(4))[1]["error"]["code"] == "model_not_allowed"  # as UTF-8: refused


def burst(gated: Gated, key: str, max_tokens: int, num_requests: int = 20) -> list[tuple[int, dict]]:
    """``num_requests`` requests released together; their statuses and bodies."""
    start = threading.Barrier(num_requests)

    def one(_: int) -> tuple[int, dict]:
        start.wait(timeout=60)
        return complete(gated, key, body(max_tokens))

    with ThreadPoolExecutor(num_requests) as pool:
        return list(pool.map(one, range(num_requests)))


@pytest.mark.parametrize(("key", "max_tokens", "num_admitted"), [
    ("burst_large", 200, 1),  # one reservation of 203 covers the quota: the other 19 wait for it, then are refused
    ("burst_small", 4, 5),  # reservations of 7 admitted at 0, 7, 14, 21 and 28 reserved
])
def test_concurrent_requests_overshoot_a_quota_by_at_most_one_reservation(gated: Gated, key: str, max_tokens: int,
                                                                          num_admitted: int) -> None:
    results = burst(gated, key, max_tokens)
    admitted = [answer for status, answer in results if status == 200]
    refused = [answer for status, answer in results if status != 200]
    assert all(answer["error"]["code"] == "quota_exceeded" for answer in refused)
    reservation = len(PROMPT) + max_tokens
    served_tokens = sum(answer["usage"]["total_tokens"] for answer in admitted)
    logged_tokens = sum(line["prompt_tokens"] + line["completion_tokens"] for line in gated.usage(key))
    assert len(admitted) == num_admitted and served_tokens == logged_tokens == num_admitted * reservation
    assert logged_tokens <= QUOTA + reservation


@pytest.mark.parametrize(("key", "max_tokens"), [("tpm_large", 200), ("tpm_small", 4)])
def test_a_burst_overshoots_tokens_per_minute_by_at_most_one_reservation(gated: Gated, key: str,
                                                                         max_tokens: int) -> None:
    started = time.monotonic()
    results = burst(gated, key, max_tokens)
    refill = (time.monotonic() - started) * TPM / 60  # what the bucket regained while the burst ran
    refused = [answer for status, answer in results if status != 200]
    assert refused and all(answer["error"]["code"] == "rate_limit_exceeded" for answer in refused)
    logged_tokens = sum(line["prompt_tokens"] + line["completion_tokens"] for line in gated.usage(key))
    assert logged_tokens <= TPM + refill + len(PROMPT) + max_tokens


@pytest.mark.parametrize(("key", "stream"), [("leaver_stream", True), ("leaver_whole", False)])
def test_a_client_that_leaves_frees_its_reservation_and_is_charged_what_it_used(gated: Gated, key: str,
                                                                               stream: bool) -> None:
    request = {"model": MODEL, "prompt": PROMPT, "max_tokens": 600, "ignore_eos": True, "stream": stream}
    sock = open_stream(gated.state, request, 3 if stream else 0,
                       headers={"Authorization": f"Bearer {gated.secrets[key]}"})
    deadline = time.monotonic() + 30
    while True:  # the in-flight reservation of 603 holds the 500-token quota
        status, answer = complete(gated, key, body(4))
        if status == 429:
            break
        assert time.monotonic() < deadline, "the leaving request was never admitted"
        time.sleep(0.05)
    assert "603 reserved by requests in flight" in answer["error"]["message"]
    num_before = len(gated.usage(key))  # the requests of 4 tokens admitted before the leaving one
    sock.close()
    while complete(gated, key, body(4))[0] != 200:  # settled: the next request is admitted
        assert time.monotonic() < deadline + 30, "the reservation of a client that left was never settled"
        time.sleep(0.1)
    lines = gated.usage(key)
    *left, admitted = lines[num_before:]  # the leaving request's line (if charged), then the one admitted after
    assert admitted["completion_tokens"] == 4
    if stream:  # it streamed some tokens, and is charged them: one line
        assert len(left) == 1 and 0 < left[0]["completion_tokens"] < 600
    else:  # charged what was generated before the handler was cancelled (nothing when no token came)
        assert len(left) <= 1 and all(line["completion_tokens"] < 600 for line in left)
    assert sum(line["prompt_tokens"] + line["completion_tokens"] for line in lines) <= 500 + 7


def test_metrics_name_no_key_without_the_admin_key(gated: Gated) -> None:
    assert complete(gated, "open", body(4))[0] == 200
    url = f"http://{gated.state['openai']}/metrics"
    for key in (None, gated.secrets["open"], "sk-kit-wrong"):
        metrics = scrape(url, key)
        labels = {label for _, series_labels in metrics for label in series_labels}
        assert not {name for name, _ in labels} & {"key", "tenant"}
        assert not {value for _, value in labels} & {*KEYS, "acme"}
        assert ("trtllm_kit_gateway_tokens_total", (("kind", "prompt"), ("model", MODEL))) in metrics
    labels = (("key", "open"), ("kind", "prompt"), ("model", MODEL), ("tenant", "acme"))
    assert scrape(url, gated.secrets["ops"])[("trtllm_kit_gateway_key_tokens_total", labels)] >= 3


def raw_post(gated: Gated, payload: bytes, headers: dict[str, str | bytes]) -> tuple[int, str, dict]:
    """A POST whose header values may be bytes, sent as they are."""
    host, port = gated.state["openai"].rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.putrequest("POST", "/v1/completions")
        for name, value in {"Content-Length": str(len(payload)), **headers}.items():
            conn.putheader(name, value)
        conn.endheaders()
        conn.send(payload)
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type", ""), json.loads(response.read())
    finally:
        conn.close()


@pytest.mark.parametrize(("authorization", "payload", "content_type", "status"), [
    ("Bearer clé".encode("latin-1"), body(4), "application/json", 401),  # not UTF-8
    ("Bearer ключ".encode(), body(4), "application/json", 401),  # UTF-8 that is not latin-1
    (None, body(4), "application/json; charset=bogus", 415),
    (None, b"[" * 100_000 + b"]" * 100_000, "application/json", 400),
    (None, b'{"prompt": "' + b"x" * MAX_BODY_BYTES + b'"}', "application/json", 413),
])
def test_malformed_requests_get_json_errors(gated: Gated, authorization: bytes | None, payload: bytes,
                                            content_type: str, status: int) -> None:
    before = gated.triton_inferences()
    headers: dict[str, str | bytes] = {"Content-Type": content_type,
                                       "Authorization": authorization or f"Bearer {gated.secrets['open']}"}
    got, got_type, answer = raw_post(gated, payload, headers)
    assert (got, got_type) == (status, "application/json; charset=utf-8"), answer
    assert set(answer["error"]) == {"message", "type", "param", "code"} and answer["error"]["message"]
    assert gated.triton_inferences() == before
