"""The gateway's answers to malformed and hostile requests, in process and without a model (Triton's address is a
closed port): every one is OpenAI's JSON error with the right status, and none reaches the admission."""

from __future__ import annotations

import asyncio
import http.client
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

import trtllm_kit
from trtllm_kit.serve.frontend import OpenAIFrontend, start_frontend
from trtllm_kit.serve.gateway.keys import add_key
from trtllm_kit.serve.openai.config import OpenAIConfig
from trtllm_kit.serve.openai.request_limits import MAX_BODY_BYTES
from trtllm_kit.serve.server.launcher import free_port

MODEL = "m"


@dataclass
class Served:
    frontend: OpenAIFrontend
    port: int
    secrets: dict[str, str]
    usage_path: Path


def run_against(tmp_path: Path, check: Callable[[Served], None]) -> None:
    """Start a gated frontend in this thread's event loop (its SIGHUP handler needs the main thread) and run
    ``check`` in a worker thread against it."""
    keys_path = tmp_path / "keys.json"
    secrets = {name: add_key(keys_path, name, **limits)[0] for name, limits in
               {"open": {}, "elsewhere": {"models": ("another",)}, "ops": {"admin": True}}.items()}
    frontend = OpenAIFrontend(OpenAIConfig(grpc_url=f"127.0.0.1:{free_port()}", served_name=MODEL,
                                           api_keys=keys_path))

    async def main() -> None:
        port = free_port()
        runner = await start_frontend(frontend, "127.0.0.1", port)
        try:
            await asyncio.wait_for(asyncio.to_thread(check, Served(frontend, port, secrets, keys_path.with_name(
                "keys.json.usage.jsonl"))), timeout=120)
        finally:
            await runner.cleanup()

    asyncio.run(main())


def send(served: Served, body: bytes, headers: dict[str, str | bytes], method: str = "POST",
         path: str = "/v1/completions") -> tuple[int, str, dict]:
    """One raw request (header values may be bytes, sent as they are); status, Content-Type and the JSON body."""
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    try:
        conn.putrequest(method, path)
        for name, value in {"Content-Length": str(len(body)), **headers}.items():
            conn.putheader(name, value)
        conn.endheaders()
        conn.send(body)
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type", ""), json.loads(response.read())
    finally:
        conn.close()


def bearer(served: Served, name: str = "open") -> dict[str, str | bytes]:
    return {"Authorization": f"Bearer {served.secrets[name]}", "Content-Type": "application/json"}


JSON = "application/json; charset=utf-8"
BODY = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 4}).encode()


@pytest.mark.parametrize(("body", "headers", "status", "code"), [
    (BODY, {"Authorization": "Bearer sk-kit-\u00e9t\u00e9".encode("latin-1")}, 401, "invalid_api_key"),  # not UTF-8
    (BODY, {"Authorization": "Bearer ключ".encode()}, 401, "invalid_api_key"),  # UTF-8, not latin-1
    (BODY, {"Authorization": b"Bearer \xff\xfe"}, 401, "invalid_api_key"),
    (BODY, {"Content-Type": "application/json; charset=utf-16"}, 415, "unsupported_media_type"),
    (BODY, {"Content-Type": "application/json; charset=cp500"}, 415, "unsupported_media_type"),
    (BODY, {"Content-Type": "application/json; charset=bogus"}, 415, "unsupported_media_type"),
    (BODY.decode().encode("utf-16"), {"Content-Type": "application/json; charset=utf-16"}, 415,
     "unsupported_media_type"),
    (b"[" * 100_000 + b"]" * 100_000, {}, 400, None),
    (b'{"model": "m", "prompt": "' + b"x" * MAX_BODY_BYTES + b'"}', {}, 413, "request_too_large"),
    (json.dumps({"model": "another-one", "prompt": "hi"}).encode(), {"Content-Type": "text/plain"}, 404,
     "model_not_found"),
    (b"{", {}, 400, None),
])
def test_malformed_requests_get_openai_json_errors(tmp_path: Path, body: bytes, headers: dict, status: int,
                                                   code: str | None) -> None:
    def check(served: Served) -> None:
        got, content_type, answer = send(served, body, {**bearer(served), **headers})
        assert (got, content_type, answer["error"]["code"]) == (status, JSON, code), answer
        assert answer["error"]["message"] and set(answer["error"]) == {"message", "type", "param", "code"}
        assert served.frontend.gateway is not None
        assert all(limits.reserved_tokens == 0 for limits in served.frontend.gateway.limits.values())

    run_against(tmp_path, check)


def test_a_restricted_key_is_refused_whatever_type_the_model_name_has(tmp_path: Path) -> None:
    def check(served: Served) -> None:
        for model in ("m", ["m"], {"m": 1}, 0):
            body = json.dumps({"model": model, "prompt": "hi"}).encode()
            status, _, answer = send(served, body, bearer(served, "elsewhere"))
            assert (status, answer["error"]["code"]) == (403, "model_not_allowed")

    run_against(tmp_path, check)


def test_unknown_routes_and_methods_are_json_too(tmp_path: Path) -> None:
    def check(served: Served) -> None:
        assert send(served, b"", bearer(served), "GET", "/v1/nowhere")[0] == 404
        for path in ("/v1/nowhere", "//v1/completions", "/v1%2Fcompletions", "/./v1/completions", "/V1/models"):
            assert send(served, BODY, {}, "POST", path)[0] == 401  # without a key nothing but /metrics answers
        status, content_type, answer = send(served, b"{}", bearer(served), "PUT", "/v1/completions")
        assert (status, content_type) == (405, JSON) and answer["error"]["message"]

    run_against(tmp_path, check)


def test_an_unexpected_failure_is_a_500_in_json_and_frees_the_reservation(tmp_path: Path) -> None:
    def check(served: Served) -> None:
        gateway = served.frontend.gateway
        assert gateway is not None
        gateway.metrics.outcome = None  # type: ignore[method-assign,assignment]  # a bug after the reservation
        status, content_type, answer = send(served, BODY, bearer(served))
        assert (status, content_type, answer["error"]["type"]) == (500, JSON, "server_error")
        assert "TypeError" in answer["error"]["message"] and "Traceback" not in answer["error"]["message"]
        assert (gateway.limits["open"].reserved_tokens, gateway.limits["open"].used_tokens) == (0, 0)

    run_against(tmp_path, check)


def test_a_request_that_fails_before_its_first_token_is_charged_nothing(tmp_path: Path) -> None:
    def check(served: Served) -> None:
        status, _, answer = send(served, BODY, bearer(served))  # Triton is not there: the generation fails
        assert status >= 500 and answer["error"]["type"] == "server_error"
        assert served.frontend.gateway is not None
        limits = served.frontend.gateway.limits["open"]
        assert (limits.used_tokens, limits.reserved_tokens) == (0, 0)
        assert not served.usage_path.exists() or served.usage_path.read_text() == ""

    run_against(tmp_path, check)


def test_health_and_version_need_no_key_and_health_reports_a_missing_engine(tmp_path: Path) -> None:
    def check(served: Served) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
        try:
            conn.request("GET", "/health")
            health = conn.getresponse()
            health.read()
            conn.request("GET", "/version")
            version = conn.getresponse()
            assert (health.status, version.status) == (503, 200)  # Triton's port is closed: not ready
            assert json.loads(version.read()) == {"version": trtllm_kit.__version__}
        finally:
            conn.close()

    run_against(tmp_path, check)
