"""An INT4 AWQ llmapi artifact runs on the CPU runtime (its loader dequantizes the weights and multiplies in the
``pre_quant_scale`` where there is one) and generates, token for token, what transformers generates with the
checkpoint's dequantized weights and its smoothed norms."""

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
from trtllm_kit.quant.awq import int4_dequantize


def dequantized_reference(name: str, ckpt: Path) -> torch.nn.Module:
    """transformers' model of the source, float32, holding every tensor of the checkpoint: int4 linears
    dequantized (times their ``pre_quant_scale``), the norms as smoothed."""
    model = load_causal_lm(builtin_dir(name), torch.float32)
    params = dict(model.named_parameters())
    with safe_open(str(next(ckpt.glob("*.safetensors"))), framework="pt") as f:
        names = set(f.keys())
        for key in names:
            if key.endswith(".weight_scale") or key.endswith(".pre_quant_scale"):
                continue
            tensor = f.get_tensor(key)
            if tensor.dtype == torch.uint8:
                module = key.removesuffix(".weight")
                tensor = int4_dequantize(tensor, f.get_tensor(f"{module}.weight_scale"))
                if f"{module}.pre_quant_scale" in names:
                    tensor = tensor * f.get_tensor(f"{module}.pre_quant_scale").float()
            if key in params:
                params[key].data.copy_(tensor)
    return model


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-phi3"])
def test_awq_artifact_runs_token_exact_against_the_dequantized_reference(name: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run(["build", f"builtin:{name}", "--target", "llmapi", "--quant", "int4-awq", "--calib-samples", "4",
                "--calib-seq-len", "32", "--until", "checkpoint", "--no-verify", "--out", str(out)]) == 0
    ckpt = out / "checkpoint"
    runtime = load_unified(ckpt)
    reference = dequantized_reference(name, ckpt)
    for prompt in PROMPTS:
        assert greedy(runtime.forward, prompt) == greedy(lambda ids: reference(ids).logits, prompt)
    source = load_causal_lm(builtin_dir(name), torch.float32)
    layer = "model.layers.0.mlp.down_proj.weight"
    assert not torch.equal(dict(source.named_parameters())[layer], dict(reference.named_parameters())[layer])


def test_plan_describes_awq_and_its_search_memory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["plan", "builtin:tiny-llama", "--target", "llmapi", "--quant", "int4-awq", "--gpu", "H100-80GB",
                "--out", str(tmp_path / "out"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert any(n.startswith("W4A16 AWQ: int4 weights in groups of 128") and n.endswith("about 0.27 of their bf16 "
               "bytes") for n in report["llmapi"]["notes"])
    assert run(["plan", "builtin:tiny-llama", "--target", "llmapi", "--quant", "int4-awq", "--awq-group-size", "64",
                "--gpu", "H100-80GB", "--out", str(tmp_path / "out64"), "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["llmapi"]["notes"]
    assert any(n.startswith("W4A16 AWQ: int4 weights in groups of 64") and n.endswith("about 0.28 of their bf16 bytes")
               for n in notes)
    calibration = report["calibration"]
    assert calibration["search_bytes"] > 0
    assert calibration["peak_bytes"] == sum(calibration[k] for k in ("layer_bytes", "activation_bytes", "kv_bytes",
                                                                    "search_bytes"))
    assert run(["plan", "builtin:tiny-llama", "--target", "engine", "--quant", "int4-awq", "--gpu", "H100-80GB",
                "--out", str(tmp_path / "awq"), "--json"]) == 0
    awq = json.loads(capsys.readouterr().out)["plan"]["ranks"][0]["weight_bytes"]
    assert run(["plan", "builtin:tiny-llama", "--target", "engine", "--gpu", "H100-80GB", "--out",
                str(tmp_path / "plain"), "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)["plan"]["ranks"][0]["weight_bytes"]
    assert awq < plain


def test_a_modelopt_awq_checkpoint_is_served_as_it_is(tmp_path: Path) -> None:
    """ModelOpt's own W4A16 AWQ export, built for llmapi (copied, not re-quantized), runs token-exact too."""
    from prequantized_inputs import modelopt_export

    pytest.importorskip("modelopt.torch.quantization", reason="nvidia-modelopt is not installed")
    source = modelopt_export("builtin:tiny-llama", tmp_path / "modelopt", "INT4_AWQ_CFG", kv_fp8=False, samples=2,
                             seq_len=16, per_batch=1)
    for tokenizer_file in builtin_dir("tiny-llama").glob("tokenizer*"):
        (source / tokenizer_file.name).write_bytes(tokenizer_file.read_bytes())
    out = tmp_path / "out"
    assert run(["build", str(source), "--target", "llmapi", "--until", "checkpoint", "--out", str(out)]) == 0
    ckpt = out / "checkpoint"
    assert (ckpt / "model.safetensors").read_bytes() == (source / "model.safetensors").read_bytes()
    runtime = load_unified(ckpt)
    reference = dequantized_reference("tiny-llama", ckpt)
    for prompt in PROMPTS:
        assert greedy(runtime.forward, prompt) == greedy(lambda ids: reference(ids).logits, prompt)
