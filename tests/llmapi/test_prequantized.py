"""Pre-quantized inputs: a ModelOpt unified FP8 checkpoint made by ModelOpt here and a compressed-tensors FP8 one
written here from its documented layout are recognised from their configs (``inspect`` names the format), built for
the llmapi target as they are (the same bytes) and run on the CPU runtime token for token like their references
(``test_prequantized_trtllm.py`` converts them for the engine and cpu targets)."""

from __future__ import annotations

import filecmp
import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch
from greedy_runs import PROMPTS, greedy
from prequantized_inputs import fp8_checkpoints, modelopt_export, with_tokenizer

from trtllm_kit.cli import run
from trtllm_kit.llmapi.load import load_unified
from trtllm_kit.models.builtin import builtin_dir

if importlib.util.find_spec("modelopt") is None:  # imported where used: collection does not load ModelOpt
    pytest.skip("nvidia-modelopt is not installed (pip install -c constraints.txt -e '.[oracle]')",
                allow_module_level=True)


def inspect_format(model: Path, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()  # whatever ModelOpt printed
    assert run(["inspect", str(model), "--json"]) == 0
    return json.loads(capsys.readouterr().out)["input_quantization"]["format"]


def build_llmapi(model: Path, out: Path) -> Path:
    assert run(["build", str(model), "--target", "llmapi", "--until", "checkpoint", "--out", str(out)]) == 0
    return out / "checkpoint"


def test_modelopt_fp8_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = with_tokenizer(modelopt_export("builtin:tiny-llama", tmp_path / "modelopt"))
    assert inspect_format(source, capsys) == "ModelOpt unified FP8"
    ckpt = build_llmapi(source, tmp_path / "out")
    for name in ("model.safetensors", "config.json", "hf_quant_config.json"):
        assert filecmp.cmp(source / name, ckpt / name, shallow=False), name
    record = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert "ModelOpt unified FP8" in json.dumps(record)
    built, unquantized = load_unified(ckpt), load_unified(source)
    for prompt in PROMPTS:
        assert greedy(built.forward, prompt) == greedy(unquantized.forward, prompt)
    capsys.readouterr()
    assert run(["build", str(source), "--target", "llmapi", "--quant", "fp8", "--until", "checkpoint", "--out",
                str(tmp_path / "again")]) == 2
    assert "is already quantized (ModelOpt unified FP8, hf_quant_config.json); the llmapi target serves it as it " \
           "is: drop --quant and --kv-cache." in capsys.readouterr().err


def test_compressed_tensors_fp8_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    compressed, modelopt = fp8_checkpoints(tmp_path)
    assert inspect_format(compressed, capsys) == "compressed-tensors FP8 (per-tensor)"
    ckpt = build_llmapi(compressed, tmp_path / "out")
    assert filecmp.cmp(compressed / "model.safetensors", ckpt / "model.safetensors", shallow=False)
    assert json.loads((ckpt / "config.json").read_text())["quantization_config"]["quant_method"] == \
        "compressed-tensors"
    assert not (ckpt / "hf_quant_config.json").exists()
    ids = torch.tensor([PROMPTS[1]])
    built, exported = load_unified(ckpt), load_unified(modelopt)
    assert torch.equal(built.forward(ids), exported.forward(ids))
    for prompt in PROMPTS:
        assert greedy(built.forward, prompt) == greedy(exported.forward, prompt)


def test_other_quantizations_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "gptq"
    shutil.copytree(builtin_dir("tiny-llama"), model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "gptq",
                                                                                     "bits": 4}}))
    assert run(["inspect", str(model)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"Error: {model} is quantized with quant_method 'gptq' (config.json), which the kit does not take as input; "
        "start from the unquantized model, or from a ModelOpt unified (FP8, NVFP4, W4A16 AWQ) or compressed-tensors "
        "FP8 checkpoint.")
