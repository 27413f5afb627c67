"""``--target llmapi --quant nvfp4`` against NVIDIA ModelOpt's ``NVFP4_DEFAULT_CFG`` + ``export_hf_checkpoint`` (its
pure-PyTorch path runs on the CPU) on every built-in family, both calibrating on the same token windows in bfloat16:
the same tensor names, dtypes and shapes; identical packed e2m1 bytes, e4m3 block ``weight_scale`` and float32
``weight_scale_2`` (one per fused q/k/v or gate/up group); every unquantized tensor identical; ``input_scale``
within ``INPUT_SCALE_RTOL`` (ModelOpt runs its windows 8 at a time, the kit one at a time, so bfloat16 rounds the
hidden states differently; measured worst 1.3 %); the same ``hf_quant_config.json`` and inline
``quantization_config`` fields (producer aside). The CPU loader's dequantized weights equal ModelOpt's dequantization.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from prequantized_inputs import INPUT_SCALE_RTOL, SAMPLES, SEQ_LEN, modelopt_export, tensors

from trtllm_kit.cli import run
from trtllm_kit.errors import KitUsageError
from trtllm_kit.quant.algos import QuantConfig, check_target
from trtllm_kit.quant.nvfp4 import nvfp4_dequantize

if importlib.util.find_spec("modelopt") is None:  # imported where used: collection does not load ModelOpt
    pytest.skip("nvidia-modelopt is not installed (pip install -c constraints.txt -e '.[oracle]')",
                allow_module_level=True)

FAMILIES = ("builtin:tiny-llama", "builtin:tiny-mistral", "builtin:tiny-qwen2", "builtin:tiny-phi3")


@pytest.mark.parametrize("model", FAMILIES)
def test_nvfp4_export_matches_modelopt(model: str, tmp_path: Path) -> None:
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

    out = tmp_path / "kit"
    assert run(["build", model, "--target", "llmapi", "--quant", "nvfp4", "--calib-samples", str(SAMPLES),
                "--calib-seq-len", str(SEQ_LEN), "--until", "checkpoint", "--no-verify", "--out", str(out)]) == 0
    ours = out / "checkpoint"
    ref_dir = modelopt_export(model, tmp_path / "modelopt", "NVFP4_DEFAULT_CFG", kv_fp8=False)
    got, want = tensors(ours), tensors(ref_dir)
    assert sorted(got) == sorted(want)
    assert {k: (t.dtype, t.shape) for k, t in got.items()} == {k: (t.dtype, t.shape) for k, t in want.items()}
    packed = [k for k, t in got.items() if t.dtype == torch.uint8]
    assert len(packed) == (4 if "phi3" in model else 7) * sum(1 for k in got if k.endswith("o_proj.weight"))
    for name in packed:
        assert torch.equal(got[name], want[name]), name
        module = name.removesuffix(".weight")
        assert torch.equal(got[f"{module}.weight_scale"].view(torch.uint8),
                           want[f"{module}.weight_scale"].view(torch.uint8)), module
        assert torch.equal(got[f"{module}.weight_scale_2"], want[f"{module}.weight_scale_2"]), module
        reference = NVFP4QTensor((want[name].shape[0], want[name].shape[1] * 2), torch.float32, want[name])
        dequantized = reference.dequantize(dtype=torch.float32, scale=want[f"{module}.weight_scale"],
                                           double_scale=want[f"{module}.weight_scale_2"], block_sizes={-1: 16})
        assert torch.equal(nvfp4_dequantize(got[name], got[f"{module}.weight_scale"],
                                            got[f"{module}.weight_scale_2"]), dequantized), module
    for name in (k for k, t in got.items() if t.dtype != torch.uint8 and not k.endswith("scale")
                 and not k.endswith("scale_2")):
        assert torch.equal(got[name], want[name]), name
    names = [k for k in got if k.endswith("input_scale")]
    worst = max(abs(got[k].item() / want[k].item() - 1) for k in names)
    assert worst <= INPUT_SCALE_RTOL, worst
    ours_q = json.loads((ours / "hf_quant_config.json").read_text())
    ref_q = json.loads((ref_dir / "hf_quant_config.json").read_text())
    assert ours_q["quantization"] == ref_q["quantization"]
    assert ref_q["quantization"]["group_size"] == 16 and ref_q["quantization"]["quant_algo"] == "NVFP4"
    inline = json.loads((ours / "config.json").read_text())["quantization_config"]
    ref_inline = json.loads((ref_dir / "config.json").read_text())["quantization_config"]
    assert {k: v for k, v in inline.items() if k != "producer"} == \
        {k: v for k, v in ref_inline.items() if k != "producer"}


@pytest.mark.parametrize("target", ["engine", "cpu"])
def test_nvfp4_is_refused_outside_llmapi(target: str) -> None:
    with pytest.raises(KitUsageError) as error:
        check_target(QuantConfig(quant="nvfp4"), target)
    assert str(error.value) == (
        "--quant nvfp4 is exported for --target llmapi only (ModelOpt's unified format, which TensorRT-LLM's "
        "PyTorch backend serves on Blackwell GPUs, compute capability >= 10.0); build with --target llmapi or "
        f"choose --quant fp8 for the {target} target.")
