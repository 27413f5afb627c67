"""Pre-quantized checkpoints the llmapi tests take in or compare with: NVIDIA ModelOpt's own export (the reference
producer of the unified format; runs on the CPU) of a built-in model, calibrated on the kit's token windows; the same
per-tensor FP8 weights in compressed-tensors' layout and in ModelOpt's; and a checkpoint's tensors. ModelOpt is
imported where it is used: collecting the tests does not load it."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from trtllm_kit.llmapi.quant_format import LAYER_LINEAR
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.models.inspect import resolve_model_path
from trtllm_kit.quant.algos import QuantConfig
from trtllm_kit.quant.calib_data import token_windows
from trtllm_kit.quant.calibrate import calibrate

SAMPLES, SEQ_LEN = 16, 64  # the calibration windows both the kit and ModelOpt run
# activation scales of the kit's calibration and ModelOpt's, relative: both run bfloat16 on the same windows,
# batched differently (``test_fp8_modelopt.py`` gives the measured worst)
INPUT_SCALE_RTOL = 0.10
TOKENIZER = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def tensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint directory's safetensors files, by name."""
    out: dict[str, torch.Tensor] = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            out.update({name: f.get_tensor(name) for name in f.keys()})  # noqa: SIM118
    return out


def modelopt_export(model: str, out: Path, config_name: str = "FP8_DEFAULT_CFG", kv_fp8: bool = True,
                    samples: int = SAMPLES, seq_len: int = SEQ_LEN, per_batch: int = 8,
                    attention: str = "sdpa") -> Path:
    """ModelOpt's ``mtq.quantize`` (its calibration on the kit's windows, ``per_batch`` per forward pass) and
    ``export_hf_checkpoint``."""
    import modelopt.torch.quantization as mtq
    from modelopt.torch import export
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(model)
    windows = token_windows(path, QuantConfig(quant="fp8", kv_cache="fp8", calib_samples=samples,
                                              calib_seq_len=seq_len))
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16, attn_implementation=attention)
    config = copy.deepcopy(getattr(mtq, config_name))
    if kv_fp8:
        config["quant_cfg"] = list(config["quant_cfg"]) + list(copy.deepcopy(mtq.FP8_KV_CFG)["quant_cfg"])

    def forward_loop(module: torch.nn.Module) -> None:
        with torch.no_grad():
            for start in range(0, len(windows), per_batch):
                module(torch.tensor(windows[start:start + per_batch]))

    mtq.quantize(hf, config, forward_loop)
    export.export_hf_checkpoint(hf, export_dir=str(out))
    return out


def with_tokenizer(directory: Path) -> Path:
    """``directory`` with tiny-llama's tokenizer files copied in (the checkpoints here hold weights and config)."""
    for name in TOKENIZER:
        if (builtin_dir("tiny-llama") / name).is_file():
            shutil.copy(builtin_dir("tiny-llama") / name, directory / name)
    return directory


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
