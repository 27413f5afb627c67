"""INT4 AWQ's group size (``--awq-group-size``, 64 or 128): the option's bounds and its record, the refusal that names
the size that fits, group scales and packing by hand at 64, the layout's scale shapes, and a group-64 checkpoint's
record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from trtllm_kit.checkpoint.convert import convert_checkpoint
from trtllm_kit.errors import KitUsageError
from trtllm_kit.layout import QuantLayout, TensorSpec, quant_entries
from trtllm_kit.models.inspect import resolve_model_path
from trtllm_kit.quant.algos import QuantConfig, check_groups
from trtllm_kit.quant.awq import group_scales, int4_dequantize, int4_pack, weight_profile
from trtllm_kit.quant.calibrate import calibrate
from trtllm_kit.runtime.model import CheckpointModel
from trtllm_kit.spec import build_spec

torch.set_num_threads(1)


@pytest.mark.parametrize(("settings", "message"), [
    ({"quant": "int4-awq", "awq_group_size": 32}, "--awq-group-size must be one of 64 or 128 (the group sizes "
     "TensorRT-LLM's W4A16 AWQ takes), got 32."),
    ({"quant": "int4-awq", "awq_group_size": True}, "--awq-group-size must be one of 64 or 128 (the group sizes "
     "TensorRT-LLM's W4A16 AWQ takes), got True."),
    ({"quant": "fp8", "awq_group_size": 64}, "--awq-group-size applies to --quant int4-awq only, not --quant fp8; "
     "leave it at its default."),
])
def test_group_sizes_other_than_64_and_128_or_off_awq_are_refused(settings: dict, message: str) -> None:
    with pytest.raises(KitUsageError) as refused:
        QuantConfig(**settings)
    assert str(refused.value) == message


@pytest.mark.parametrize("group_size", [64, 128])
def test_the_group_size_is_recorded_as_the_checkpoints_group_size(group_size: int) -> None:
    spec = build_spec({}, {"model": "builtin:tiny-llama", "out": "out", "build": {"target": "llmapi"},
                           "quant": {"quant": "int4-awq", "awq_group_size": group_size}})
    config = spec.quant_config()
    assert config.quantization_block()["group_size"] == group_size
    assert config.calibration_params()["awq_group_size"] == group_size  # the searched scales depend on it
    assert spec.to_dict()["quant"]["awq_group_size"] == group_size  # in the cache key and trtllm-kit.toml


@pytest.mark.parametrize(("widths", "message"), [
    ((576, 576, 1536, 1), "--quant int4-awq quantizes groups of 128 input features, but the model's hidden size "
     "(q/k/v, gate/up inputs) is 576, not a multiple of 128; build with --awq-group-size 64."),
    ((576, 576, 1536, 8), "--quant int4-awq quantizes groups of 128 input features, but the model's hidden size "
     "(q/k/v, gate/up inputs) is 576, not a multiple of 128; use --quant fp8 or int8-wo for this model (or "
     "another --tp)."),
    ((96, 96, 256, 1), "--quant int4-awq quantizes groups of 128 input features, but the model's hidden size "
     "(q/k/v, gate/up inputs) is 96, not a multiple of 128; use --quant fp8 or int8-wo for this model (or another "
     "--tp)."),
])
def test_a_refusal_names_the_group_size_that_fits_when_one_does(widths: tuple[int, int, int, int],
                                                                message: str) -> None:
    with pytest.raises(KitUsageError) as refused:
        check_groups(QuantConfig(quant="int4-awq"), *widths)
    assert str(refused.value) == message


def test_group_size_64_takes_the_widths_128_refuses() -> None:
    check_groups(QuantConfig(quant="int4-awq", awq_group_size=64), 576, 576, 1536, 1)
    with pytest.raises(KitUsageError, match=r"attention output per rank \(o_proj input\) is 288, not a multiple of 64"):
        check_groups(QuantConfig(quant="int4-awq", awq_group_size=64), 576, 576, 1536, 2)


def test_groups_of_64_by_hand() -> None:
    """Two groups per row: each scale is its group's amax / 7, each code round(W / scale) in [-8, 7], packed two
    rows a byte, and the dequantized weight is code x its own group's scale."""
    weight = torch.zeros(2, 128)
    weight[0, :64], weight[0, 64:] = 7.0, -0.7
    weight[1, 0], weight[1, 64] = 3.5, 14.0
    scales = group_scales(weight, 64)
    assert scales.shape == (2, 2)
    assert scales.flatten().tolist() == pytest.approx([1.0, 0.1, 0.5, 2.0])
    packed = int4_pack(weight, scales)
    assert packed.shape == (1, 128)
    back = int4_dequantize(packed, scales)
    assert back[0].tolist() == pytest.approx([7.0] * 64 + [-0.7] * 64)
    assert back[1, 0] == pytest.approx(3.5) and back[1, 64] == pytest.approx(14.0)
    assert back[1, 1:64].abs().sum() == 0 and back[1, 65:].abs().sum() == 0
    # read with one scale per 128 (a wrong group size), the second half would take the first half's scale
    assert not torch.equal(int4_dequantize(packed, scales[:, :1]), back)


def test_the_weight_profile_divides_by_each_groups_own_amax() -> None:
    weight = torch.cat([torch.full((1, 64), 2.0), torch.full((1, 64), 8.0)], dim=1)
    weight[0, 0], weight[0, 64] = 4.0, 16.0
    assert weight_profile(weight, 64)[[0, 1, 64, 65]].tolist() == [1.0, 0.5, 1.0, 0.5]
    assert weight_profile(weight, 128)[[0, 1, 64, 65]].tolist() == [0.25, 0.125, 1.0, 0.5]


def test_scales_that_do_not_divide_the_weight_are_refused() -> None:
    with pytest.raises(ValueError, match=r"INT4 weight scales \(2, 3\) do not divide a weight of 128"):
        int4_dequantize(torch.zeros(1, 128, dtype=torch.uint8), torch.ones(2, 3))


def test_the_layout_reads_the_group_size_from_the_quantization_block() -> None:
    spec = TensorSpec((192, 576), "float16")
    name = "transformer.layers.0.attention.qkv.weight"
    for group_size in (64, 128):
        layout = QuantLayout.from_dict({"quant_algo": "W4A16_AWQ", "group_size": group_size})
        shapes = dict(quant_entries(name, spec, layout))
        assert shapes["transformer.layers.0.attention.qkv.weights_scaling_factor"].shape == (192, 576 // group_size)
    assert QuantLayout.from_dict({"quant_algo": "W4A16_AWQ"}).group_size == 128


def test_a_group_64_checkpoint_records_64_and_loads(tmp_path: Path) -> None:
    """The engine target's checkpoint at group size 64: the config records 64, the scales hold one column per 64
    input features, and the CPU runtime loads and runs it (token-exact and against ModelOpt:
    test_awq_trtllm_modelopt.py)."""
    config = QuantConfig(quant="int4-awq", calib_samples=2, calib_seq_len=16, awq_group_size=64)
    stats = calibrate(resolve_model_path("builtin:tiny-llama"), config, device="cpu")
    convert_checkpoint("builtin:tiny-llama", tmp_path / "ckpt", quant=config, stats=stats)
    quantization = json.loads((tmp_path / "ckpt" / "config.json").read_text())["quantization"]
    assert (quantization["quant_algo"], quantization["group_size"]) == ("W4A16_AWQ", 64)
    with safe_open(str(tmp_path / "ckpt" / "rank0.safetensors"), framework="pt") as f:
        packed = f.get_tensor("transformer.layers.0.mlp.proj.weight")
        scales = f.get_tensor("transformer.layers.0.mlp.proj.weights_scaling_factor")
    assert scales.shape == (packed.shape[0] * 2, packed.shape[1] // 64)
    logits = CheckpointModel.load(tmp_path / "ckpt", torch.float32).forward(torch.tensor([[1, 17, 305, 9, 44]]))
    assert bool(logits.isfinite().all())
