"""Quantized checkpoints on the CPU runtime against the unquantized HF model: perplexity on the held-out text.

Bounds (``trtllm_kit.checkpoint.verify``): |perplexity change| W8A16 1 %, FP8 2 %, SmoothQuant 5 %, KV cache alone
1 %; mean KL(unquantized ‖ quantized) W8A16 0.02, FP8 0.2, SmoothQuant 0.1, KV alone 0.05. Measured on these
cases (calibration 16 × 128 tokens, 2048 corpus tokens): perplexity -0.6 % … +1.2 %; KL W8A16 ≤ 0.0093 (with
INT8 KV), FP8 0.093 – 0.108, SmoothQuant 0.010 – 0.025, INT8 KV alone 0.006. The random-weight models'
perplexity sits near the vocabulary size and barely moves, so KL is the check that catches a wrong scale.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from trtllm_kit.checkpoint.convert import convert_checkpoint
from trtllm_kit.checkpoint.verify import quality_bounds, verify_checkpoint
from trtllm_kit.errors import CheckpointError
from trtllm_kit.quant.algos import QuantConfig
from trtllm_kit.quant.calibrate import CalibrationStats
from trtllm_kit.quant.int8 import w8a16_round_trip
from trtllm_kit.runtime.model import CheckpointModel

torch.set_num_threads(1)
CASES = [
    ("tiny-llama", 1, 1, QuantConfig(quant="int8-wo")),
    ("tiny-llama", 1, 1, QuantConfig(quant="fp8", kv_cache="fp8")),
    ("tiny-llama", 2, 2, QuantConfig(quant="int8-sq", kv_cache="int8")),
    ("tiny-mistral", 1, 1, QuantConfig(quant="fp8")),
    ("tiny-mistral", 2, 1, QuantConfig(quant="int8-sq", per_channel=True, per_token=True)),
    ("tiny-qwen2", 1, 2, QuantConfig(quant="int8-wo", kv_cache="int8")),
    ("tiny-qwen2", 2, 1, QuantConfig(quant="fp8", kv_cache="fp8")),
    ("tiny-qwen2", 1, 1, QuantConfig(quant="int8-sq", per_channel=True)),
    ("tiny-qwen2", 4, 1, QuantConfig(kv_cache="int8")),
]


@pytest.mark.parametrize(("name", "tp", "pp", "config"), CASES,
                         ids=[f"{n}-tp{t}pp{p}-{c.quant_algo}-{c.kv_cache_quant_algo}" for n, t, p, c in CASES])
def test_perplexity_change_within_bound(name: str, tp: int, pp: int, config: QuantConfig, tiny: dict[str, Path],
                                        stats: dict[str, CalibrationStats], tmp_path: Path) -> None:
    convert_checkpoint(tiny[name], tmp_path / "c", tp_size=tp, pp_size=pp, quant=config, stats=stats[name])
    report = verify_checkpoint(tmp_path / "c", tiny[name])
    bound, kl_bound = quality_bounds(config.quant_algo)
    assert report.quantization == f"{config.quant_algo}/{config.kv_cache_quant_algo}"
    assert abs(report.perplexity_change) < bound, report
    assert report.kl_divergence < kl_bound, report
    assert report.passed
    assert report.top1_agreement > 0.4  # the random models' logits are flat; quantization reorders close calls


def test_a_wrong_scale_fails_the_bound(tiny: dict[str, Path], stats: dict[str, CalibrationStats],
                                       tmp_path: Path) -> None:
    ckpt = tmp_path / "c"
    convert_checkpoint(tiny["tiny-llama"], ckpt, quant=QuantConfig(quant="fp8"), stats=stats["tiny-llama"])
    tensors = load_file(ckpt / "rank0.safetensors")
    for layer in range(3):
        tensors[f"transformer.layers.{layer}.mlp.proj.weights_scaling_factor"] *= 2
    save_file(tensors, str(ckpt / "rank0.safetensors"))
    report = verify_checkpoint(ckpt, tiny["tiny-llama"])
    assert not report.passed
    assert report.kl_divergence > quality_bounds("FP8")[1]


def test_runtime_simulates_the_kv_cache(tiny: dict[str, Path], stats: dict[str, CalibrationStats],
                                        tmp_path: Path) -> None:
    """The keys and values that leave ``qkv`` are exactly representable in the quantized cache."""
    convert_checkpoint(tiny["tiny-llama"], tmp_path / "c", quant=QuantConfig(kv_cache="int8"),
                       stats=stats["tiny-llama"])
    model = CheckpointModel.load(tmp_path / "c")
    scale = model.weights(0, 0)["transformer.layers.0.attention.kv_cache_scaling_factor"]
    x = model.norm(0, "input_layernorm", model.embed(torch.tensor([[1, 50, 60, 70]])))
    _, k, v = model.qkv(0, 0, x, torch.arange(4)[None], 4)
    for t in (k, v):
        steps = t / scale
        torch.testing.assert_close(steps, steps.round(), rtol=0, atol=1e-3)
        assert float(steps.abs().max()) <= 128


@pytest.mark.parametrize(("quant", "drop", "message"), [
    (QuantConfig(quant="fp8"), "transformer.layers.1.mlp.gate.activation_scaling_factor",
     "{path} lacks the tensor 'transformer.layers.1.mlp.gate.activation_scaling_factor' that quant_algo FP8 / "
     "kv_cache_quant_algo None needs; convert the checkpoint again."),
    (QuantConfig(quant="int8-sq"), "transformer.layers.0.attention.quantization_scaling_factor",
     "{path} lacks the tensor 'transformer.layers.0.attention.quantization_scaling_factor' that quant_algo "
     "W8A8_SQ_PER_TENSOR_PLUGIN / kv_cache_quant_algo None needs; convert the checkpoint again."),
    (QuantConfig(kv_cache="fp8"), "transformer.layers.2.attention.kv_cache_scaling_factor",
     "{path} lacks the tensor 'transformer.layers.2.attention.kv_cache_scaling_factor' that quant_algo None / "
     "kv_cache_quant_algo FP8 needs; convert the checkpoint again."),
])
def test_runtime_refuses_a_checkpoint_without_its_scales(quant: QuantConfig, drop: str, message: str,
                                                         tiny: dict[str, Path], stats: dict[str, CalibrationStats],
                                                         tmp_path: Path) -> None:
    ckpt = tmp_path / "c"
    convert_checkpoint(tiny["tiny-mistral"], ckpt, quant=quant, stats=stats["tiny-mistral"])
    tensors = load_file(ckpt / "rank0.safetensors")
    del tensors[drop]
    save_file(tensors, str(ckpt / "rank0.safetensors"))
    with pytest.raises(CheckpointError) as error:
        CheckpointModel.load(ckpt)
    assert str(error.value) == message.format(path=ckpt / "rank0.safetensors")


def test_runtime_runs_w8a16_with_the_preview_weights(tiny: dict[str, Path], tmp_path: Path) -> None:
    convert_checkpoint(tiny["tiny-llama"], tmp_path / "c", tp_size=2, quant=QuantConfig(quant="int8-wo"))
    stored = load_file(tmp_path / "c" / "rank1.safetensors")
    model = CheckpointModel.load(tmp_path / "c")
    name = "transformer.layers.2.mlp.proj.weight"
    assert stored[name].dtype == torch.bfloat16
    assert torch.equal(model.weights(0, 1)[name], w8a16_round_trip(stored[name]).float())
    assert torch.equal(model.weights(0, 1)["lm_head.weight"], stored["lm_head.weight"].float())  # not quantized
