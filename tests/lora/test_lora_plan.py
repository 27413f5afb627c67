"""``plan`` shows the LoRA cache memory on each target: one adapter at the highest rank (Σ over layers and target
modules of r × (in + out) × element bytes) times the adapters cached, checked against a hand computation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtllm_kit.cli import run

LLAMA3_8B = Path(__file__).parents[1] / "data" / "hf-configs" / "meta-llama--Meta-Llama-3-8B"
# Llama-3-8B: H 4096, 32 query heads and 8 KV heads of 128, I 14336, 32 layers, bfloat16
Q_PROJ, V_PROJ, O_PROJ, DOWN_PROJ = 4096 + 4096, 4096 + 1024, 4096 + 4096, 14336 + 4096  # in + out
ADAPTER = 32 * 16 * (Q_PROJ + V_PROJ + O_PROJ + DOWN_PROJ) * 2  # 32 layers, rank 16, 2 bytes: 40,894,464 bytes (39 MiB)


@pytest.mark.parametrize("target", ["cpu", "engine", "llmapi"])
def test_plan_shows_the_lora_cache_on_each_target(target: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["plan", str(LLAMA3_8B), "--target", target, "--gpu", "H100", "--max-lora-rank", "16", "--max-loras", "8",
             "--lora-target-modules", "q_proj,attn_v,o_proj,mlp_4h_to_h", "--out", str(tmp_path / "out")]
    assert run([*flags, "--json"]) == 0
    lora = json.loads(capsys.readouterr().out)["lora"]
    assert ADAPTER == 40_894_464
    assert lora == {"target_modules": ["q_proj", "v_proj", "o_proj", "down_proj"], "max_lora_rank": 16, "max_loras": 8,
                    "cache": {"adapter_bytes": ADAPTER, "max_loras": 8, "max_lora_rank": 16, "dtype": "bfloat16",
                              "total_bytes": 8 * ADAPTER}}
    assert run(flags) == 0
    assert (f"LoRA cache ({target}): 8 adapters x 39.00 MiB = 312.00 MiB (each at rank 16 on q_proj, v_proj, o_proj, "
            "down_proj in every layer, bfloat16") in capsys.readouterr().out


def test_plan_without_lora_shows_no_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["plan", str(LLAMA3_8B), "--gpu", "H100", "--out", str(tmp_path / "out"), "--json"]) == 0
    assert "lora" not in json.loads(capsys.readouterr().out)
