"""Quantized checkpoints: exact tensor names, dtypes and shapes per rank, the exact ``quantization`` block, and the
values of the scales (shared for fused layers, from the calibration statistics, identical on every rank)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from trtllm_kit.checkpoint.convert import convert_checkpoint
from trtllm_kit.quant.algos import QuantConfig
from trtllm_kit.quant.calibrate import CalibrationStats
from trtllm_kit.quant.int8 import smoothing_scales
from trtllm_kit.safetensors_io import read_header

torch.set_num_threads(1)
BF16, F32, I8, F8 = "BF16", "F32", "I8", "F8_E4M3"
NO_QUANT = {"quant_algo": None, "kv_cache_quant_algo": None, "group_size": 128, "has_zero_point": False,
            "pre_quant_scale": False, "exclude_modules": None}
# tiny-llama at tp=2: H=256, 4 heads / 2 KV heads of 64 → qkv rows (2 + 2·1)·64 = 256, I/tp = 256, V = 1031 → 516
PLAIN = {"input_layernorm.weight": (BF16, [256]), "attention.qkv.weight": (BF16, [256, 256]),
         "attention.dense.weight": (BF16, [256, 128]), "post_layernorm.weight": (BF16, [256]),
         "mlp.fc.weight": (BF16, [256, 256]), "mlp.gate.weight": (BF16, [256, 256]),
         "mlp.proj.weight": (BF16, [256, 256])}
FP8_LAYER = {"input_layernorm.weight": (BF16, [256]), "post_layernorm.weight": (BF16, [256]),
             "attention.kv_cache_scaling_factor": (F32, [1])}
for module, shape in (("attention.qkv", [256, 256]), ("attention.dense", [256, 128]), ("mlp.fc", [256, 256]),
                      ("mlp.gate", [256, 256]), ("mlp.proj", [256, 256])):
    FP8_LAYER |= {f"{module}.weight": (F8, shape), f"{module}.weights_scaling_factor": (F32, [1]),
                  f"{module}.activation_scaling_factor": (F32, [1])}
SQ_STATIC_LAYER = {
    "input_layernorm.weight": (BF16, [256]), "input_layernorm.scale_to_int": (F32, [1]),
    "attention.qkv.weight": (I8, [256, 256]), "attention.qkv.per_channel_scale": (F32, [1, 256]),
    "attention.qkv.act_scale": (F32, [1, 1]), "attention.kv_cache_scaling_factor": (F32, [1]),
    "attention.dense.weight": (I8, [256, 128]), "attention.dense.per_channel_scale": (F32, [1, 1]),
    "attention.dense.act_scale": (F32, [1, 1]), "attention.dense.smoother": (F32, [1, 128]),
    "attention.quantization_scaling_factor": (F32, [1]),
    "post_layernorm.weight": (BF16, [256]), "post_layernorm.scale_to_int": (F32, [1]),
    "mlp.fc.weight": (I8, [256, 256]), "mlp.fc.per_channel_scale": (F32, [1, 1]), "mlp.fc.act_scale": (F32, [1, 1]),
    "mlp.gate.weight": (I8, [256, 256]), "mlp.gate.per_channel_scale": (F32, [1, 1]),
    "mlp.gate.act_scale": (F32, [1, 1]),
    "mlp.proj.weight": (I8, [256, 256]), "mlp.proj.per_channel_scale": (F32, [1, 1]),
    "mlp.proj.act_scale": (F32, [1, 1]), "mlp.proj.smoother": (F32, [1, 256]),
    "mlp.quantization_scaling_factor": (F32, [1]),
}
SQ_DYNAMIC_LAYER = {
    "input_layernorm.weight": (BF16, [256]), "input_layernorm.scale_to_int": (F32, [1]),
    "attention.qkv.weight": (I8, [256, 256]), "attention.qkv.per_channel_scale": (F32, [1, 256]),
    "attention.dense.weight": (I8, [256, 128]), "attention.dense.per_channel_scale": (F32, [1, 256]),
    "attention.dense.smoother": (F32, [1, 128]),
    "post_layernorm.weight": (BF16, [256]), "post_layernorm.scale_to_int": (F32, [1]),
    "mlp.fc.weight": (I8, [256, 256]), "mlp.fc.per_channel_scale": (F32, [1, 256]),
    "mlp.gate.weight": (I8, [256, 256]), "mlp.gate.per_channel_scale": (F32, [1, 256]),
    "mlp.proj.weight": (I8, [256, 256]), "mlp.proj.per_channel_scale": (F32, [1, 256]),
    "mlp.proj.smoother": (F32, [1, 256]),
}
CASES = {
    "int8-wo": (QuantConfig(quant="int8-wo"), PLAIN, {**NO_QUANT, "quant_algo": "W8A16"}),
    "int8-wo+int8kv": (QuantConfig(quant="int8-wo", kv_cache="int8"),
                       {**PLAIN, "attention.kv_cache_scaling_factor": (F32, [1])},
                       {**NO_QUANT, "quant_algo": "W8A16", "kv_cache_quant_algo": "INT8"}),
    "fp8+fp8kv": (QuantConfig(quant="fp8", kv_cache="fp8"), FP8_LAYER,
                  {**NO_QUANT, "quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]}),
    "sq+int8kv": (QuantConfig(quant="int8-sq", kv_cache="int8"), SQ_STATIC_LAYER,
                  {**NO_QUANT, "quant_algo": "W8A8_SQ_PER_TENSOR_PLUGIN", "kv_cache_quant_algo": "INT8"}),
    "sq-channel-token": (QuantConfig(quant="int8-sq", per_channel=True, per_token=True), SQ_DYNAMIC_LAYER,
                         {**NO_QUANT, "quant_algo": "W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN"}),
}


def layout(path: Path) -> dict[str, tuple[str, list[int]]]:
    return {name: (entry["dtype"], entry["shape"]) for name, entry in read_header(path).items()}


def expected_rank(layer_table: dict[str, tuple[str, list[int]]], num_layers: int, *, first: bool,
                  last: bool) -> dict[str, tuple[str, list[int]]]:
    expected = {f"transformer.layers.{i}.{name}": value
                for i in range(num_layers) for name, value in layer_table.items()}
    if first:
        expected["transformer.vocab_embedding.weight"] = (BF16, [1031, 256])
    if last:
        expected |= {"transformer.ln_f.weight": (BF16, [256]), "lm_head.weight": (BF16, [516, 256])}
    return expected


@pytest.fixture(scope="module")
def built(tiny: dict[str, Path], stats: dict[str, CalibrationStats],
          tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for case, (config, _, _) in CASES.items():
        out[case] = tmp_path_factory.mktemp("q") / case
        convert_checkpoint(tiny["tiny-llama"], out[case], tp_size=2, pp_size=2, quant=config,
                           stats=stats["tiny-llama"])
    return out


@pytest.mark.parametrize("case", CASES)
def test_exact_layout_per_rank_at_tp2_pp2(case: str, built: dict[str, Path]) -> None:
    _, layer_table, _ = CASES[case]
    for rank in range(4):
        pp_rank = rank // 2
        expected = expected_rank(layer_table, 2 if pp_rank == 0 else 1, first=pp_rank == 0, last=pp_rank == 1)
        assert layout(built[case] / f"rank{rank}.safetensors") == expected, f"rank {rank}"


@pytest.mark.parametrize("case", CASES)
def test_exact_quantization_block(case: str, built: dict[str, Path]) -> None:
    config = json.loads((built[case] / "config.json").read_text())
    assert config["quantization"] == CASES[case][2]
    assert config["mapping"] == {"world_size": 4, "tp_size": 2, "pp_size": 2}


def test_fp8_scales_shared_by_fused_layers_and_equal_on_every_rank(built: dict[str, Path],
                                                                   stats: dict[str, CalibrationStats]) -> None:
    st = stats["tiny-llama"]
    ranks = [load_file(built["fp8+fp8kv"] / f"rank{r}.safetensors") for r in range(4)]
    for rank in ranks[:2]:  # stage 0 holds global layers 0 and 1
        for layer in range(2):
            p, hf = f"transformer.layers.{layer}.", f"model.layers.{layer}."
            qkv_w = max(float(st.w[f"{hf}self_attn.{m}_proj"].max()) for m in "qkv")
            assert rank[p + "attention.qkv.weights_scaling_factor"].tolist() == pytest.approx([qkv_w / 448])
            x = float(st.x[f"{hf}self_attn.q_proj"].max())
            assert rank[p + "attention.qkv.activation_scaling_factor"].tolist() == pytest.approx([x / 448])
            fc_w = max(float(st.w[f"{hf}mlp.{m}_proj"].max()) for m in ("gate", "up"))
            for module in ("fc", "gate"):
                assert rank[p + f"mlp.{module}.weights_scaling_factor"].tolist() == pytest.approx([fc_w / 448])
            assert torch.equal(rank[p + "mlp.fc.activation_scaling_factor"],
                               rank[p + "mlp.gate.activation_scaling_factor"])
            kv = max(float(st.y[f"{hf}self_attn.{m}_proj"].max()) for m in "kv")
            assert rank[p + "attention.kv_cache_scaling_factor"].tolist() == [max(kv / 448, 1.0)]
    for name, tensor in ranks[0].items():
        if tensor.dtype == torch.float32:
            assert torch.equal(tensor, ranks[1][name]), name


def test_fp8_weights_dequantize_to_the_hf_weights(built: dict[str, Path], tiny: dict[str, Path]) -> None:
    hf = load_file(tiny["tiny-llama"] / "model.safetensors")
    rank = load_file(built["fp8+fp8kv"] / "rank1.safetensors")  # tp_rank 1 of stage 0
    wsf = rank["transformer.layers.1.mlp.proj.weights_scaling_factor"]
    back = rank["transformer.layers.1.mlp.proj.weight"].float() * wsf
    original = torch.chunk(hf["model.layers.1.mlp.down_proj.weight"].float(), 2, dim=1)[1]
    assert not torch.isnan(back).any()
    torch.testing.assert_close(back, original, rtol=2 ** -4, atol=float(wsf) * 2 ** -6)


def test_smoothquant_tensors_follow_the_statistics(built: dict[str, Path], tiny: dict[str, Path],
                                                   stats: dict[str, CalibrationStats]) -> None:
    st, hf = stats["tiny-llama"], load_file(tiny["tiny-llama"] / "model.safetensors")
    r0, r1 = (load_file(built["sq+int8kv"] / f"rank{r}.safetensors") for r in (0, 1))
    p, m = "transformer.layers.0.", "model.layers.0."
    wc = torch.stack([st.wc[f"{m}self_attn.{x}_proj"] for x in "qkv"]).amax(0)
    s = smoothing_scales(st.x[f"{m}self_attn.q_proj"], wc, 0.5)
    norm = (hf[f"{m}input_layernorm.weight"].float() / s).to(torch.bfloat16)
    assert torch.equal(r0[p + "input_layernorm.weight"], norm)
    assert r0[p + "input_layernorm.scale_to_int"].tolist() == pytest.approx(
        [127 / float((st.x[f"{m}self_attn.q_proj"] / s).max())])
    # o_proj: smoother split along the input dimension, per_channel_scale (1, 1) on every rank
    s_dense = smoothing_scales(st.x[f"{m}self_attn.o_proj"], st.wc[f"{m}self_attn.o_proj"], 0.5)
    torch.testing.assert_close(torch.cat([r0[p + "attention.dense.smoother"], r1[p + "attention.dense.smoother"]], 1),
                               s_dense.reshape(1, -1))
    assert torch.equal(r0[p + "attention.dense.per_channel_scale"], r1[p + "attention.dense.per_channel_scale"])
    # int8 weights × their scales rebuild the smoothed weight: W·diag(s) ≈ q / (127 / amax_part)
    q = r0[p + "attention.qkv.weight"].float()
    q_part = hf[f"{m}self_attn.q_proj.weight"].float() * s
    amax_q = q_part.abs().max()
    torch.testing.assert_close(q[:128] * amax_q / 127, q_part[:128], rtol=0, atol=float(amax_q) / 127 * 0.51)
    assert r0[p + "attention.kv_cache_scaling_factor"].tolist() == pytest.approx(
        [max(float(st.y[f"{m}self_attn.{x}_proj"].max()) for x in "qkv") / 127])


def test_per_token_norms_have_unit_scale_to_int(built: dict[str, Path]) -> None:
    rank = load_file(built["sq-channel-token"] / "rank0.safetensors")
    assert rank["transformer.layers.0.input_layernorm.scale_to_int"].tolist() == [1.0]
    assert rank["transformer.layers.1.post_layernorm.scale_to_int"].tolist() == [1.0]
