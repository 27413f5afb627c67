"""A served model that takes no adapters (a repository without the LoRA inputs, as an engine built without the
LoRA plugin has) refuses a request naming one of its recorded adapters with a 400 in OpenAI's format; the adapter
is still listed with its parent."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from kit_server import KitServer

from trtllm_kit.artifact import AdapterRecord, Artifact
from trtllm_kit.artifact.files import file_hashes
from trtllm_kit.artifact.integrity import file_stats

pytestmark = [pytest.mark.integration, pytest.mark.slow]
MODEL = "builtin:tiny-llama"


def test_a_model_without_lora_inputs_refuses_its_adapters(make_out: Callable[..., Path], tmp_path: Path) -> None:
    out = make_out(tmp_path / "out")
    (out / "lora" / "support").mkdir(parents=True)
    (out / "lora" / "support" / "adapter.safetensors").write_bytes(b"never read: the model takes no adapters")
    artifact = Artifact.read(out)
    record = AdapterRecord(name="support", source="/adapters/support", sha256="0" * 64, rank=4, alpha=8.0,
                           target_modules=["q_proj"], dir="lora/support")
    files = {k: v for k, v in file_hashes(out).items() if k != "manifest.json"}
    stats = {k: v for k, v in file_stats(out).items() if k in files}
    replace(artifact, records=replace(artifact.records, adapters={"support": record}), files=files,
            file_stats=stats).write()
    with KitServer(out) as server:
        port = server.port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30) as response:
            cards = {c["id"]: c for c in json.loads(response.read())["data"]}
        assert cards["support"]["parent"] == MODEL and cards["support"]["root"] == "/adapters/support"
        body = {"model": "support", "prompt": "hello", "max_tokens": 4}
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        error = json.loads(refused.value.read())["error"]
        assert refused.value.code == 400 and error["type"] == "invalid_request_error"
        assert error["message"] == ("the model 'ensemble' takes no LoRA adapters (it has no lora_task_id input); "
                                    "serve an artifact built for adapters, or name the base model.")
