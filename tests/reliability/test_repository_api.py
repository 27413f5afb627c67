"""Nobody who reaches Triton's ports of a ``trtllm-kit serve`` loads code through its repository API, in any key
mode; with a key mode on, nobody infers there without the serve's token either. One real serve per key mode
(none, ``--api-key``, ``--api-keys``), attacked over HTTP and gRPC as a hostile client would: an uploaded Python
model whose import writes a marker file."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from reliability_helpers import kit
from serving_helpers import MODEL, post, serve
from tritonclient.grpc import service_pb2, service_pb2_grpc

from trtllm_kit.serve.client import TextClient
from trtllm_kit.serve.gateway.keys import add_key
from trtllm_kit.serve.generation import GenerationError
from trtllm_kit.serve.server.detach import stop_serving
from trtllm_kit.serve.server.launcher import GRPC_RESTRICTED_HEADER, RESTRICTED_HEADER
from trtllm_kit.serve.server.state import TOKEN_FILE
from trtllm_kit.wire import GenerationRequest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
KEY = "sk-repository-test-key"
PWN_CONFIG = json.dumps({"name": "pwn", "backend": "python", "max_batch_size": 0,  # the API takes config as JSON
                         "input": [{"name": "x", "data_type": "TYPE_INT32", "dims": [1]}],
                         "output": [{"name": "y", "data_type": "TYPE_INT32", "dims": [1]}]})


def pwn_code(marker: Path) -> bytes:
    """A Python model whose import writes ``marker`` (code execution as the server's user)."""
    return (f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n\n"
            "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n").encode()


@pytest.fixture(scope="module", params=["none", "api-key", "api-keys"])
def guarded(request: pytest.FixtureRequest, tiny_artifact: Path,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A serve of a copy of the tiny artifact in one key mode; its state, ``mode`` and the ``key`` a client sends."""
    root = tmp_path_factory.mktemp(f"guarded-{request.param}")
    out = root / "out"
    shutil.copytree(tiny_artifact, out)
    settings: dict[str, Any] = {}
    key = None
    if request.param == "api-key":
        settings, key = {"api_key": KEY}, KEY
    elif request.param == "api-keys":
        key = add_key(root / "keys.json", "client")[0]
        settings = {"api_keys": root / "keys.json"}
    state = serve(out, **settings)
    yield {**state, "mode": request.param, "key": key, "root": root}
    stop_serving(out, 60)  # in this process: `trtllm-kit stop` is test_serve_faults' subject


def token_of(state: dict[str, Any]) -> str:
    return (Path(state["run_dir"]) / TOKEN_FILE).read_text()


def test_the_token_is_kept_for_the_owner_only(guarded: dict[str, Any]) -> None:
    path = Path(guarded["run_dir"]) / TOKEN_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    token = token_of(guarded)
    assert len(token) >= 32 and token not in (Path(guarded["run_dir"]) / "state.json").read_text()
    cmdline = Path(f"/proc/{guarded['server_pid']}/cmdline").read_bytes().decode()  # what any local user reads
    assert token not in cmdline and "--http-restricted-api=" in cmdline and "trtllm-kit-token=<hidden>" in cmdline
    for log in (Path(guarded["log"]), Path(guarded["run_dir"]) / "serve.log"):
        assert token not in log.read_text(errors="replace")


def test_an_uploaded_model_is_refused_over_http(guarded: dict[str, Any]) -> None:
    marker = guarded["root"] / "pwned-http"
    body = json.dumps({"parameters": {"config": PWN_CONFIG,
                                      "file:1/model.py": base64.b64encode(pwn_code(marker)).decode()}}).encode()
    for headers in ({}, {RESTRICTED_HEADER: "guessed"}, {"Authorization": f"Bearer {guarded['key'] or KEY}"}):
        status, _, answer = post(f"http://{guarded['http']}/v2/repository/models/pwn/load", body, headers)
        assert status == 403 and b"restricted" in answer.lower(), (headers, status, answer)
        status, _, answer = post(f"http://{guarded['http']}/v2/repository/index", b"{}", headers)
        assert status == 403 and b"restricted" in answer.lower(), (headers, status, answer)
    time.sleep(1)
    assert not marker.exists()


def test_an_uploaded_model_is_refused_over_grpc(guarded: dict[str, Any]) -> None:
    marker = guarded["root"] / "pwned-grpc"
    parameters = {"config": service_pb2.ModelRepositoryParameter(string_param=PWN_CONFIG),
                  "file:1/model.py": service_pb2.ModelRepositoryParameter(bytes_param=pwn_code(marker))}

    async def attack() -> list[grpc.StatusCode]:
        async with grpc.aio.insecure_channel(guarded["grpc"]) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            codes = []
            for metadata in ((), ((GRPC_RESTRICTED_HEADER, "guessed"),)):
                for call, message in ((stub.RepositoryModelLoad,
                                       service_pb2.RepositoryModelLoadRequest(model_name="pwn", parameters=parameters)),
                                      (stub.RepositoryIndex, service_pb2.RepositoryIndexRequest())):
                    try:
                        await call(message, metadata=metadata, timeout=30)
                        codes.append(grpc.StatusCode.OK)
                    except grpc.aio.AioRpcError as exc:
                        codes.append(exc.code())
            return codes

    assert asyncio.run(attack()) == [grpc.StatusCode.UNAVAILABLE] * 4
    time.sleep(1)
    assert not marker.exists()


def test_inference_without_the_token_follows_the_key_mode(guarded: dict[str, Any]) -> None:
    body = json.dumps({"text_input": "hi", "max_tokens": 2}).encode()
    status, _, answer = post(f"http://{guarded['http']}/v2/models/tensorrt_llm_bls/generate", body)

    async def grpc_generate() -> str:
        client = TextClient(guarded["grpc"], "tensorrt_llm_bls")  # no token
        try:
            return "".join([chunk.text async for chunk in client.stream(GenerationRequest("hi", 2))])
        except GenerationError as exc:
            return f"refused: {exc}"
        finally:
            await client.close()

    text = asyncio.run(grpc_generate())
    if guarded["mode"] == "none":  # open, as docs/security.md says: a reachable Triton port serves inference
        assert status == 200 and json.loads(answer)["text_output"], answer
        assert text and not text.startswith("refused"), text
    else:
        assert status == 403 and b"restricted" in answer.lower(), (status, answer)
        assert text.startswith("refused") and "restricted" in text.lower(), text


def test_the_serve_and_its_reload_still_work(guarded: dict[str, Any]) -> None:
    done = kit("generate", "The capital of France is", "--url", guarded["grpc"], "--max-tokens", "4")
    assert done.returncode == 0 and done.stdout.strip(), done.stderr
    url = f"http://{guarded['openai']}/v1/completions"
    headers = {"Authorization": f"Bearer {guarded['key']}"} if guarded["key"] else {}
    completion = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2}).encode()
    assert post(url, completion, headers)[0] == 200
    new_out = guarded["root"] / "next"
    shutil.copytree(guarded["out"], new_out)
    done = kit("reload", MODEL, str(new_out), "--out", str(guarded["out"]), "--json", timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["version"] == 2
    assert post(url, completion, headers)[0] == 200


def test_the_same_upload_with_the_token_runs(guarded: dict[str, Any]) -> None:
    """The refusals above are the restriction's: the same request with the serve's token loads the model and its
    code runs (the serve holds the token for its reloads)."""
    marker = guarded["root"] / "pwned-with-token"
    body = json.dumps({"parameters": {"config": PWN_CONFIG,
                                      "file:1/model.py": base64.b64encode(pwn_code(marker)).decode()}}).encode()
    base, headers = f"http://{guarded['http']}/v2/repository", {RESTRICTED_HEADER: token_of(guarded)}
    status, _, answer = post(f"{base}/models/pwn/load", body, headers)
    assert status == 200 and marker.read_text() == "ran", (status, answer)
    assert post(f"{base}/models/pwn/unload", b"{}", headers)[0] == 200
