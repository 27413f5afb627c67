"""An NVFP4 llmapi artifact runs on the CPU runtime (its loader dequantizes the weights) and generates, token for
token, what transformers generates with the same dequantized weights; the build's verify holds it to the NVFP4
quality bounds; the plan says NVFP4 needs compute capability >= 10.0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from greedy_runs import PROMPTS, greedy
from safetensors import safe_open

from trtllm_kit.cli import run
from trtllm_kit.llmapi.load import load_unified
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.models.hf_model import load_causal_lm
from trtllm_kit.quant.nvfp4 import nvfp4_dequantize


def dequantized_reference(name: str, ckpt: Path) -> torch.nn.Module:
    """transformers' model of the source, float32, every linear replaced by the checkpoint's dequantized weight."""
    model = load_causal_lm(builtin_dir(name), torch.float32)
    with safe_open(str(next(ckpt.glob("*.safetensors"))), framework="pt") as f:
        params = dict(model.named_parameters())
        for key in f.keys():  # noqa: SIM118
            if key.endswith(".weight_scale_2"):
                module = key.removesuffix(".weight_scale_2")
                weight = nvfp4_dequantize(f.get_tensor(f"{module}.weight"), f.get_tensor(f"{module}.weight_scale"),
                                          f.get_tensor(key))
                params[f"{module}.weight"].data.copy_(weight)
    return model


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_nvfp4_artifact_runs_token_exact_against_the_dequantized_reference(name: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run(["build", f"builtin:{name}", "--target", "llmapi", "--quant", "nvfp4", "--calib-samples", "8",
                "--calib-seq-len", "32", "--until", "checkpoint", "--out", str(out)]) == 0
    ckpt = out / "checkpoint"
    runtime = load_unified(ckpt)
    reference = dequantized_reference(name, ckpt)
    for prompt in PROMPTS:
        assert greedy(runtime.forward, prompt) == greedy(lambda ids: reference(ids).logits, prompt)
    unquantized = load_causal_lm(builtin_dir(name), torch.float32)
    assert any(greedy(lambda ids: unquantized(ids).logits, p) != greedy(runtime.forward, p) for p in PROMPTS) or \
        not torch.equal(unquantized.model.layers[0].mlp.up_proj.weight,
                        reference.model.layers[0].mlp.up_proj.weight)  # the 4-bit weights are really in use


def test_plan_says_nvfp4_needs_blackwell(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["plan", "builtin:tiny-llama", "--target", "llmapi", "--quant", "nvfp4", "--gpu", "H100-80GB",
                "--out", str(tmp_path / "out"), "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["llmapi"]["notes"]
    assert any(n.startswith("NVFP4 needs compute capability >= 10.0 (Blackwell); H100-80GB is SM 9.0") for n in notes)
