"""LoRA for every built-in family through one real tritonserver: each family's cpu build with a rank-4 adapter on
the attention modules and a rank-16 adapter on the MLP modules (PEFT's names; Phi-3's fused ones), all served by one
``trtllm-kit serve``; the base and both adapters of every family, sent at once through the OpenAI API with the
adapter named in ``model``, decode greedily to the tokens of the HF model and of PEFT's ``PeftModel``."""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from kit_server import KitServer

from tests.lora.adapters import MAX_RANK, make_adapter, peft_greedy
from trtllm_kit.cli import run
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.serve.server.state import read_state
from trtllm_kit.serve.service import stop_serving

pytestmark = [pytest.mark.integration, pytest.mark.slow]
PROMPT = [5, 77, 301, 9, 640, 12, 18, 999, 3]
MAX_TOKENS = 8
SPLIT = {"attn4": (4, 8, ["q_proj", "k_proj", "v_proj", "o_proj"]), "mlp16": (16, 32, ["gate_proj", "up_proj",
                                                                                      "down_proj"])}
FUSED = {"attn4": (4, 8, ["qkv_proj", "o_proj"]), "mlp16": (16, 32, ["gate_up_proj", "down_proj"])}  # Phi-3's names
FAMILIES = {"tiny-llama": SPLIT, "tiny-mistral": SPLIT, "tiny-qwen2": SPLIT, "tiny-phi3": FUSED}
Served = tuple[str, dict[str, Path]]  # the OpenAI URL; each adapter's served name and PEFT directory


def adapter_name(family: str, adapter: str) -> str:
    return f"{family}-{adapter}"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("lora-families")
    sources: dict[str, Path] = {}
    outs: list[Path] = []
    for family, adapters in FAMILIES.items():
        loras = []
        for seed, (adapter, (rank, alpha, targets)) in enumerate(adapters.items()):
            name = adapter_name(family, adapter)
            sources[name] = make_adapter(builtin_dir(family), root / name, rank=rank, targets=targets, alpha=alpha,
                                         seed=seed)
            loras += ["--lora", f"{name}={sources[name]}"]
        outs.append(root / family)
        assert run(["build", f"builtin:{family}", "--target", "cpu", "--dtype", "float32", "--no-verify",
                    "--instances", "1", "--max-lora-rank", str(MAX_RANK), *loras, "--out", str(outs[-1])]) == 0
    server = KitServer(outs[0], more=tuple(outs[1:]), names=tuple(f"{o.name}={o}" for o in outs),
                       ready_timeout_s=180).start()
    yield server.url, sources
    if read_state(outs[0]) is not None:
        stop_serving(outs[0], 30)


def peft_tokens(family: str, source: Path | None) -> list[int]:
    """The greedy tokens of the family's HF model, or of PeftModel with the adapter at ``source`` on it."""
    return peft_greedy(builtin_dir(family), source, PROMPT, MAX_TOKENS)


def served_tokens(url: str, model: str) -> list[int]:
    """The greedy token ids the OpenAI API streams for ``model``."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
            "stream": True}
    request = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        text = response.read().decode()
    events = [json.loads(e[len("data: "):]) for e in text.split("\n\n") if e and e != "data: [DONE]"]
    return [t for e in events if e["choices"] for t in e["choices"][0].get("token_ids", [])]


def test_every_family_with_two_adapters_in_one_batch_equals_peft(served: Served) -> None:
    url, sources = served
    expected: dict[str, list[int]] = {}
    for family, adapters in FAMILIES.items():
        expected[family] = peft_tokens(family, None)
        for adapter in adapters:
            expected[adapter_name(family, adapter)] = peft_tokens(family, sources[adapter_name(family, adapter)])
        outputs = {tuple(expected[family])} | {tuple(expected[adapter_name(family, a)]) for a in adapters}
        assert len(outputs) == 1 + len(adapters), family  # each adapter changes the family's output
    with ThreadPoolExecutor(len(expected)) as pool:  # every base and adapter at once
        got = dict(zip(expected, pool.map(lambda model: served_tokens(url, model), expected), strict=True))
    assert got == expected
