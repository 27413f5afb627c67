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
from safetensors.torch import load_file, save_file
from test_fp8_modelopt import modelopt_export

from trtllm_kit.cli import run
from trtllm_kit.llmapi.load import load_unified
from trtllm_kit.llmapi.quant_format import LAYER_LINEAR
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.quant.algos import QuantConfig
from trtllm_kit.quant.calibrate import calibrate

if importlib.util.find_spec("modelopt") is None:  # imported where used: collection does not load ModelOpt
    pytest.skip("nvidia-modelopt is not installed (pip install -c constraints.txt -e '.[oracle]')",
                allow_module_level=True)
PROMPTS = ([1, 17, 305, 9, 44], [1, 600, 601, 2, 73, 73, 19, 5, 250])
NEW_TOKENS = 12
TOKENIZER = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def greedy(model_dir: Path, prompt: list[int]) -> list[int]:
    runtime = load_unified(model_dir)
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            ids.append(int(runtime.forward(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt):]


def with_tokenizer(directory: Path) -> Path:
    for name in TOKENIZER:
        if (builtin_dir("tiny-llama") / name).is_file():
            shutil.copy(builtin_dir("tiny-llama") / name, directory / name)
    return directory


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
    for prompt in PROMPTS:
        assert greedy(ckpt, prompt) == greedy(source, prompt)
    capsys.readouterr()
    assert run(["build", str(source), "--target", "llmapi", "--quant", "fp8", "--until", "checkpoint", "--out",
                str(tmp_path / "again")]) == 2
    assert "is already quantized (ModelOpt unified FP8, hf_quant_config.json); the llmapi target serves it as it " \
           "is: drop --quant and --kv-cache." in capsys.readouterr().err


def fp8_checkpoints(tmp_path: Path) -> tuple[Path, Path]:
    """The same per-tensor FP8 weights twice: in compressed-tensors' layout (``[1]`` scales, its config) and in
    ModelOpt's (scalar scales, ``hf_quant_config.json``)."""
    source = builtin_dir("tiny-llama")
    stats = calibrate(source, QuantConfig(quant="fp8", calib_samples=4, calib_seq_len=32))
    plain = load_file(str(source / "model.safetensors"))
    ct, mo = {}, {}
    for name, tensor in plain.items():
        linear = LAYER_LINEAR.match(name)
        if linear is None:
            ct[name] = mo[name] = tensor
            continue
        module = linear.group(1)
        weight_scale = (tensor.abs().max().float() / 448).reshape(1)
        input_scale = (stats.get("x", module).max() / 448).reshape(1)
        ct[name] = mo[name] = (tensor.float() / weight_scale).clamp(-448, 448).to(torch.float8_e4m3fn)
        ct[f"{module}.weight_scale"], ct[f"{module}.input_scale"] = weight_scale, input_scale
        mo[f"{module}.weight_scale"], mo[f"{module}.input_scale"] = weight_scale.reshape(()), input_scale.reshape(())
    config = json.loads((source / "config.json").read_text())
    scheme = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False, "strategy": "tensor"}
    compressed = {**config, "quantization_config": {
        "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": scheme, "input_activations": scheme}},
        "ignore": ["lm_head"], "kv_cache_scheme": None}}
    directories = []
    for name, tensors, cfg in (("ct", ct, compressed), ("mo", mo, config)):
        (tmp_path / name).mkdir()
        directory = with_tokenizer(tmp_path / name)
        save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
        (directory / "config.json").write_text(json.dumps(cfg))
        directories.append(directory)
    (directories[1] / "hf_quant_config.json").write_text(json.dumps(
        {"producer": {"name": "test", "version": "0"},
         "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": None, "exclude_modules": ["lm_head"]}}))
    return directories[0], directories[1]


def test_compressed_tensors_fp8_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    compressed, modelopt = fp8_checkpoints(tmp_path)
    assert inspect_format(compressed, capsys) == "compressed-tensors FP8 (per-tensor)"
    ckpt = build_llmapi(compressed, tmp_path / "out")
    assert filecmp.cmp(compressed / "model.safetensors", ckpt / "model.safetensors", shallow=False)
    assert json.loads((ckpt / "config.json").read_text())["quantization_config"]["quant_method"] == \
        "compressed-tensors"
    assert not (ckpt / "hf_quant_config.json").exists()
    ids = torch.tensor([PROMPTS[1]])
    assert torch.equal(load_unified(ckpt).forward(ids), load_unified(modelopt).forward(ids))
    for prompt in PROMPTS:
        assert greedy(ckpt, prompt) == greedy(modelopt, prompt)


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
