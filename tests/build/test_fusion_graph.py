"""The fused decoder layer: a valid ONNX graph whose nodes are the fusions the trtllm-build flags imply."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from trtllm_kit.build_limits import Limits
from trtllm_kit.checkpoint.fusion_graph import FUSED, PLUGIN, fusion_table, layer_graph, to_onnx, write_graph
from trtllm_kit.cli import run
from trtllm_kit.gpus import gpu_from_table
from trtllm_kit.mapping import Mapping
from trtllm_kit.models.hf_config import HFConfig, read_hf_config
from trtllm_kit.models.registry import family_for
from trtllm_kit.plan import make_plan
from trtllm_kit.precision import Precision
from trtllm_kit.trtllm_build.recipe import build_command

LLAMA3_8B = Path(__file__).parents[1] / "data" / "hf-configs" / "meta-llama--Meta-Llama-3-8B"
LIMITS = Limits(max_batch_size=16, max_seq_len=4096, max_num_tokens=4096)
SQ = "W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN"


@pytest.fixture(scope="module")
def hf() -> HFConfig:
    return read_hf_config(LLAMA3_8B)


def recipe_graph(hf: HFConfig, precision: Precision, tp: int, gpu: str = "H100-80GB",
                 overrides: dict[str, str] | None = None) -> tuple[onnx.ModelProto, dict[str, onnx.NodeProto]]:
    board = gpu_from_table(gpu)
    plan = make_plan(hf, family_for(hf, "llama"), Mapping(tp, 1), precision, board, LIMITS)
    command = build_command(plan, board, Path("c"), Path("e"), workers=1, overrides=overrides)
    model = to_onnx(layer_graph(hf, precision, tp, dict(command.flags)))
    return model, {n.name: n for n in model.graph.node}


def attrs(node: onnx.NodeProto) -> dict[str, object]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def op(node: onnx.NodeProto) -> str:
    return f"{node.domain}::{node.op_type}" if node.domain else node.op_type


def input_shape(model: onnx.ModelProto, name: str) -> tuple[list[int | str], int]:
    [value] = [v for v in model.graph.input if v.name == name]
    dims = [d.dim_value or d.dim_param for d in value.type.tensor_type.shape.dim]
    return dims, value.type.tensor_type.elem_type


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_fp16_recipe(hf: HFConfig, tp: int, tmp_path: Path) -> None:
    model, nodes = recipe_graph(hf, Precision("float16"), tp)
    path = write_graph(layer_graph(hf, Precision("float16"), tp, {}), tmp_path / "bare.onnx")
    onnx.checker.check_model(onnx.load(str(path)))
    onnx.checker.check_model(model)
    assert {o.domain for o in model.opset_import} == {"", PLUGIN, FUSED}
    kv_heads = max(1, 8 // tp)
    assert attrs(nodes["attention"]) == {
        "num_heads": 32 // tp, "num_kv_heads": kv_heads, "head_size": 128, "tokens_per_block": 32,
        "paged_kv_cache": 1, "context_fmha": b"enable", "paged_context_fmha": b"enable", "fp8_context_fmha": 0,
        "kv_cache_dtype": b"float16", "position_embedding_type": b"rope_gpt_neox", "rotary_base": 500000.0}
    assert op(nodes["attention"]) == f"{PLUGIN}::GPTAttention"
    assert op(nodes["attention.qkv"]) == f"{PLUGIN}::Gemm"                     # --gemm_plugin auto
    assert input_shape(model, "attention.qkv.weight") == ([(32 // tp + 2 * kv_heads) * 128, 4096],
                                                          TensorProto.FLOAT16)
    assert input_shape(model, "mlp.fused_fc.weight") == ([2 * 14336 // tp, 4096], TensorProto.FLOAT16)  # fused MLP
    assert "mlp.fc" not in nodes and "mlp.gate" not in nodes
    assert input_shape(model, "hidden_states")[0] == ["num_tokens", 4096]       # --remove_input_padding enable
    if tp == 1:
        assert not [n for n in nodes.values() if n.op_type == "AllReduce"]
        assert op(nodes["attention.post_layernorm"]) == "RMSNormalization"
    else:  # --reduce_fusion enable: all-reduce + residual add + norm in one plugin
        assert op(nodes["attention.allreduce"]) == f"{PLUGIN}::AllReduce"
        assert attrs(nodes["attention.allreduce"])["fusion_op"] == b"RESIDUAL_RMS_NORM"
        assert attrs(nodes["mlp.allreduce"])["fusion_op"] == b"RESIDUAL"
        assert "attention.post_layernorm" not in nodes and "attention.residual_add" not in nodes
    assert model.graph.output[0].name == "hidden_states_out"


def test_fp8_on_hopper_uses_the_fp8_kernels(hf: HFConfig) -> None:
    model, nodes = recipe_graph(hf, Precision("bfloat16", "FP8", "FP8"), 2)
    assert attrs(nodes["attention"])["fp8_context_fmha"] == 1
    assert attrs(nodes["attention"])["kv_cache_dtype"] == b"fp8"
    assert (op(nodes["attention.qkv"]), attrs(nodes["attention.qkv"])["type"]) == (f"{PLUGIN}::Gemm", b"fp8")
    assert op(nodes["mlp.fused_fc"]) == f"{PLUGIN}::GemmSwiGLU"                 # --gemm_swiglu_plugin fp8
    assert input_shape(model, "mlp.fused_fc.weight") == ([2 * 7168, 4096], TensorProto.FLOAT8E4M3FN)
    assert "mlp.sigmoid" not in nodes


def test_fp8_on_ada_has_no_hopper_kernels(hf: HFConfig) -> None:
    _, nodes = recipe_graph(hf, Precision("bfloat16", "FP8", "FP8"), 1, gpu="L40S")
    assert attrs(nodes["attention"])["fp8_context_fmha"] == 0
    assert op(nodes["attention.qkv"]) == f"{FUSED}::FP8QDQGemm"
    assert op(nodes["mlp.fused_fc"]) == f"{FUSED}::FP8QDQGemm"                  # fused MLP stays on for FP8
    assert op(nodes["mlp.swiglu"]) == "Mul"


def test_weight_only_int8_turns_fused_mlp_off(hf: HFConfig) -> None:
    model, nodes = recipe_graph(hf, Precision("float16", "W8A16"), 1)
    assert "mlp.fused_fc" not in nodes
    for name in ("attention.qkv", "attention.dense", "mlp.fc", "mlp.gate", "mlp.proj"):
        assert op(nodes[name]) == f"{PLUGIN}::WeightOnlyQuantMatmul"
    assert input_shape(model, "mlp.fc.weight") == ([4096, 14336], TensorProto.INT8)  # transposed int8 at build
    rows = {r["node"]: r for r in fusion_table(layer_graph(hf, Precision("float16", "W8A16"), 1,
                                                          {"use_fused_mlp": "disable"}))}
    assert rows["mlp.fc"]["why"] == ("quant_algo W8A16 (weight_only_quant_matmul_plugin), --use_fused_mlp disable "
                                     "(quant_algo W8A16 turns it off)")


def test_smoothquant_fuses_norm_and_quantization(hf: HFConfig) -> None:
    model, nodes = recipe_graph(hf, Precision("float16", SQ, "INT8"), 2)
    for name in ("input_layernorm", "post_layernorm"):
        assert op(nodes[name]) == f"{PLUGIN}::RmsnormQuantization"
        assert attrs(nodes[name])["per_token"] == 1
    assert op(nodes["attention.dense.quantize"]) == f"{PLUGIN}::QuantizePerToken"
    assert op(nodes["mlp.proj"]) == f"{PLUGIN}::SmoothQuantGemm"
    assert attrs(nodes["attention"])["kv_cache_dtype"] == b"int8"
    assert attrs(nodes["attention.allreduce"])["fusion_op"] == b"RESIDUAL"  # the norm is the SQ plugin's
    assert input_shape(model, "mlp.proj.smoother") == ([1, 7168], TensorProto.FLOAT)


def test_overrides_change_the_graph(hf: HFConfig) -> None:
    overrides = {"gemm_plugin": "disable", "reduce_fusion": "disable", "use_fused_mlp": "disable"}
    _, nodes = recipe_graph(hf, Precision("float16"), 2, overrides=overrides)
    assert op(nodes["attention.qkv"]) == "MatMul" and op(nodes["attention.qkv.transpose"]) == "Transpose"
    assert attrs(nodes["attention.allreduce"])["fusion_op"] == b"NONE"
    assert op(nodes["attention.residual_add"]) == "Add" and op(nodes["attention.post_layernorm"]) == "RMSNormalization"
    assert op(nodes["mlp.fc"]) == "MatMul" and op(nodes["mlp.gate"]) == "MatMul"


def test_plan_graph_cli_writes_the_graph_and_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graph = tmp_path / "plan.onnx"
    code = run(["plan", str(LLAMA3_8B), "--gpu", "H100-80GB", "--tp", "2", "--quant", "fp8", "--kv-cache", "fp8",
                "--max-seq-len", "4096", "--graph", str(graph), "--out", str(tmp_path / "out"), "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    model = onnx.load(str(graph))
    onnx.checker.check_model(model)
    assert [row["node"] for row in report["fusion"]] == [n.name for n in model.graph.node]
    rows = {row["node"]: row for row in report["fusion"]}
    assert rows["mlp.fused_fc"]["op"] == f"{PLUGIN}::GemmSwiGLU"
    assert rows["attention.allreduce"]["why"] == "--reduce_fusion enable (tp > 1)"
    assert report["stages"][0]["status"] == "cannot build"  # config.json only: planned, not buildable
    assert report["plan"]["precision"] == {"dtype": "bfloat16", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8",
                                           "kv_dtype": "fp8"}


def test_graph_needs_a_gpu_to_plan_for(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from trtllm_kit.artifact.machine import Machine

    monkeypatch.setattr("trtllm_kit.build.dry_run.detect_machine", lambda: Machine(None, None, None, None, ()))
    code = run(["plan", str(LLAMA3_8B), "--graph", str(tmp_path / "g.onnx"), "--out", str(tmp_path / "out")])
    assert code == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        "Error: --graph needs the trtllm-build flags, which need a GPU to plan for: pass --gpu NAME or --gpu-memory "
        "GiB.")
