"""Hostile adapter loads against a real ``trtllm-kit serve`` (tritonserver and its OpenAI frontend, no keys): a dozen
FIFOs, links to ``/dev/zero`` and out of the directory, oversized files, NaN weights, an over-long ``lora_path``
and an adapter of another base are each a 400 naming the field, answered while the attack's file is still there;
afterwards a valid adapter loads and generates, and the serve stops gracefully."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from kit_server import KitServer

from tests.lora.adapters import make_adapter
from tests.lora.hostile import (
    CONFIG,
    WEIGHTS,
    release_fifos,
    with_config,
    with_fifo,
    with_link,
    with_many_tensors,
    with_nan,
    with_outside_link,
    with_padded_config,
)
from trtllm_kit.cli import run
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.serve.server.state import read_state
from trtllm_kit.serve.service import stop_serving

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TIMEOUT_S = 60  # a refusal takes milliseconds; a load blocked on a FIFO never answers
NUM_FIFOS = 12  # more than the frontend's worker threads (8 blocked loads stopped every later one)


@dataclass
class Served:
    out: Path
    url: str
    root: Path
    good: Path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("hostile-serve")
    good = make_adapter(builtin_dir("tiny-llama"), root / "good", rank=4, targets=["q_proj", "v_proj"], alpha=8,
                        seed=1)
    out = root / "out"
    assert run(["build", "builtin:tiny-llama", "--target", "cpu", "--dtype", "float32", "--no-verify",
                "--instances", "1", "--max-lora-rank", "16", "--lora-target-modules", "q_proj,v_proj",
                "--out", str(out)]) == 0
    server = KitServer(out).start()  # its own: it loads adapters and is stopped by a test
    yield Served(out, server.url, root, good)
    release_fifos(root)  # a server that blocked on one gets its end of file
    if read_state(out) is not None:
        stop_serving(out, 60)


def post(served: Served, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any] | str]:
    request = urllib.request.Request(served.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            text = response.read().decode()
            return response.status, json.loads(text) if path == "/v1/completions" else text
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read().decode())


def refused(served: Served, body: dict[str, Any], param: str, words: str) -> None:
    status, answer = post(served, "/v1/load_lora_adapter", body)
    assert status == 400 and isinstance(answer, dict), (status, answer)
    error = answer["error"]
    assert error["param"] == param and words in error["message"], error


def generates(served: Served, model: str) -> bool:
    status, answer = post(served, "/v1/completions", {"model": model, "prompt": [5, 77, 301], "max_tokens": 4,
                                                      "temperature": 0, "ignore_eos": True})
    return status == 200 and isinstance(answer, dict) and answer["usage"]["completion_tokens"] == 4


def test_hostile_files_are_400s_and_valid_loads_go_on(served: Served) -> None:
    good, root = served.good, served.root
    for number in range(NUM_FIFOS):
        fifo = with_fifo(good, root / f"fifo{number}", CONFIG if number % 2 == 0 else WEIGHTS)
        refused(served, {"lora_name": f"fifo{number}", "lora_path": str(fifo)}, "lora_path",
                "is a FIFO, not a regular file")
    attacks = {"zero-config": (with_link(good, root / "zero-config", CONFIG, Path("/dev/zero")), "/dev/zero, outside"),
               "zero-weights": (with_link(good, root / "zero-weights", WEIGHTS, Path("/dev/zero")),
                                "/dev/zero, outside"),
               "outside": (with_outside_link(good, root / "outside", CONFIG), "outside"),
               "huge-config": (with_padded_config(good, root / "huge-config", 4 << 20), "above the bound of 1048576"),
               "huge-header": (with_many_tensors(good, root / "huge-header", 100_000), "above the bound of")}
    for name, (source, words) in attacks.items():
        refused(served, {"lora_name": name, "lora_path": str(source)}, "lora_path", words)
    status, text = post(served, "/v1/load_lora_adapter", {"lora_name": "good", "lora_path": str(good)})
    assert status == 200, text
    assert generates(served, "good")


def test_client_mistakes_are_400s_naming_the_field(served: Served) -> None:
    good, root = served.good, served.root
    refused(served, {"lora_name": "long", "lora_path": "/" + "a" * 4999}, "lora_path",
            "lora_path is 5000 characters, above the bound of 4096")
    refused(served, {"lora_name": "nul", "lora_path": f"{good}\0x"}, "lora_path", "lora_path holds a NUL character")
    refused(served, {"lora_name": "n" * 5000, "lora_path": str(good)}, "lora_name", "is not valid")
    refused(served, {"lora_name": "forced", "lora_path": str(good), "force": "yes"}, "force",
            "force must be true or false")
    refused(served, {"lora_name": "nan", "lora_path": str(with_nan(good, root / "nan"))}, "lora_path",
            "holds NaN or infinite values")
    refused(served, {"lora_name": "inf", "lora_path": str(with_nan(good, root / "inf", math.inf))}, "lora_path",
            "holds NaN or infinite values")
    refused(served, {"lora_name": "loud", "lora_path": str(with_config(good, root / "loud", lora_alpha=1e300))},
            "lora_path", "not finite in float32 once scaled")
    status, answer = post(served, "/v1/completions", {"model": "nan", "prompt": [5], "max_tokens": 2,
                                                      "temperature": 0})
    assert status == 404, answer  # never loaded: no request can run on it


def test_an_adapter_of_another_base_is_refused_unless_forced(served: Served,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    other = with_config(served.good, served.root / "other", base_model_name_or_path="Qwen/Qwen2.5-0.5B")
    refused(served, {"lora_name": "other", "lora_path": str(other)}, "lora_path",
            "records base_model_name_or_path 'Qwen/Qwen2.5-0.5B'")
    capsys.readouterr()
    assert run(["lora", "load", "--url", served.url, "other", str(other)]) == 2
    assert "records base_model_name_or_path" in capsys.readouterr().err
    assert run(["lora", "load", "--url", served.url, "other", str(other), "--force"]) == 0
    assert generates(served, "other")


def test_the_serve_stops_gracefully_after_the_attacks(served: Served) -> None:
    """Runs last: nothing the attacks started holds the serve."""
    assert generates(served, "builtin:tiny-llama")
    assert stop_serving(served.out, 60)["forced"] is False
    assert read_state(served.out) is None
