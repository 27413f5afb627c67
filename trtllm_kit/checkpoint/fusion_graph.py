"""One decoder layer as the engine will run it, for a precision and a set of ``trtllm-build`` flags.

The layer is an ONNX graph (``plan --graph plan.onnx``; opens in Netron): standard ONNX ops where TensorRT
runs plain math, domain ``trtllm.plugin`` for TensorRT-LLM plugins (GEMM, GPT attention with paged KV,
all-reduce with residual/norm fusion, GEMM-SwiGLU, weight-only and SmoothQuant GEMMs, norm+quantize), and
domain ``trtllm.fused`` for fusions TensorRT itself makes (FP8 GEMMs without the plugin). Weights are graph
inputs with their per-rank shapes and build-time dtypes, so the file stays small. ``fusion_table`` gives
the same nodes as rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
from onnx import TensorProto, helper

from trtllm_kit.mapping import kv_heads_per_rank
from trtllm_kit.models.hf_config import HFConfig
from trtllm_kit.precision import Precision

PLUGIN = "trtllm.plugin"
FUSED = "trtllm.fused"
ONNX_OPSET = 23
ELEMENT = {"float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16, "float32": TensorProto.FLOAT,
           "int8": TensorProto.INT8, "fp8": TensorProto.FLOAT8E4M3FN, "int32": TensorProto.INT32}


@dataclass
class LayerGraph:
    """Nodes, inputs and outputs of one decoder layer, plus which flag put each node there."""

    dtype: str
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    inputs: list[onnx.ValueInfoProto] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)  # node name → the flag or precision that implies it
    shapes: dict[str, list[int | str]] = field(default_factory=dict)

    def tensor(self, name: str, elem: str, shape: list[int | str]) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, ELEMENT[elem], shape))
        self.shapes[name] = shape
        return name

    def node(self, name: str, op: str, inputs: list[str], outputs: list[str], why: str, domain: str = "",
             shape: list[int | str] | None = None, **attrs: Any) -> list[str]:
        self.nodes.append(helper.make_node(op, inputs, outputs, name=name, domain=domain or None, **attrs))
        self.reasons[name] = why
        if shape is not None:
            self.shapes[outputs[0]] = shape
        return outputs


def layer_graph(hf: HFConfig, precision: Precision, tp_size: int, flags: dict[str, str]) -> LayerGraph:
    """Build the layer for a model, precision, tensor-parallel size and the command's flags.

    Arguments:
        hf: the model config.
        precision: checkpoint dtype and quantization.
        tp_size: tensor-parallel size.
        flags: the ``trtllm-build`` flags (name → value) of the command.
    """
    g = LayerGraph(precision.dtype)
    h, d = hf.hidden_size, hf.head_dim
    heads, kv_heads, inter = hf.num_attention_heads // tp_size, kv_heads_per_rank(hf.num_key_value_heads, tp_size), \
        hf.intermediate_size // tp_size
    tokens: int | str = "num_tokens" if flags.get("remove_input_padding") == "enable" else "batch_x_seq"
    act = precision.dtype
    x = g.tensor("hidden_states", act, [tokens, h])
    for name in ("input_layernorm.weight", "post_layernorm.weight"):
        g.tensor(name, act, [h])
    normed = _norm(g, "input_layernorm", x, precision, flags, tokens, h)
    qkv = _gemm(g, "attention.qkv", normed, (heads + 2 * kv_heads) * d, h, precision, flags, tokens)
    paged = flags.get("kv_cache_type") == "paged"
    attention_inputs = [qkv, g.tensor("sequence_length", "int32", ["batch"]),
                        g.tensor("context_lengths", "int32", ["batch"])]
    if paged:
        attention_inputs.append(g.tensor("kv_cache_block_offsets", "int32", ["batch", 2, "max_blocks_per_seq"]))
    fp8_fmha = flags.get("use_fp8_context_fmha") == "enable"
    (context,) = g.node(
        "attention", "GPTAttention", attention_inputs, ["attention.context"],
        f"--gpt_attention_plugin {flags.get('gpt_attention_plugin')}, --context_fmha {flags.get('context_fmha')}, "
        f"--use_paged_context_fmha {flags.get('use_paged_context_fmha')}, --kv_cache_type {flags.get('kv_cache_type')}"
        + (", --use_fp8_context_fmha enable" if fp8_fmha else ""),
        PLUGIN, [tokens, heads * d], num_heads=heads, num_kv_heads=kv_heads, head_size=d,
        tokens_per_block=int(flags.get("tokens_per_block", 0)), paged_kv_cache=int(paged),
        context_fmha=flags.get("context_fmha", ""), paged_context_fmha=flags.get("use_paged_context_fmha", ""),
        fp8_context_fmha=int(fp8_fmha), kv_cache_dtype=precision.kv_dtype,
        position_embedding_type="rope_gpt_neox", rotary_base=float(hf.rope_theta))
    dense = _gemm(g, "attention.dense", context, h, heads * d, precision, flags, tokens, row=True)
    sq = (precision.quant_algo or "").startswith("W8A8_SQ_")
    normed, residual = _reduce(g, "attention", dense, x, tp_size, flags, tokens, h,
                               norm=None if sq else "post_layernorm.weight", out="attention.residual")
    if sq:
        normed = _norm(g, "post_layernorm", residual, precision, flags, tokens, h)
    hidden = _mlp(g, normed, precision, flags, tokens, h, inter)
    proj = _gemm(g, "mlp.proj", hidden, h, inter, precision, flags, tokens, row=True)
    _reduce(g, "mlp", proj, residual, tp_size, flags, tokens, h, norm=None, out="hidden_states_out")
    return g


def _norm(g: LayerGraph, name: str, x: str, precision: Precision, flags: dict[str, str], tokens: int | str,
          h: int) -> str:
    weight = f"{name}.weight"
    algo = precision.quant_algo or ""
    if algo.startswith("W8A8_SQ_"):
        return g.node(name, "RmsnormQuantization", [x, weight], [f"{name}.int8"],
                      f"quant_algo {algo} (rmsnorm_quantization_plugin)", PLUGIN, [tokens, h],
                      per_token=int("PER_TOKEN" in algo))[0]
    if precision.quant_algo == "FP8" and flags.get("norm_quant_fusion") == "enable":
        return g.node(name, "RmsNormQuantFP8", [x, weight], [f"{name}.fp8"], "--norm_quant_fusion enable", PLUGIN,
                      [tokens, h])[0]
    return g.node(name, "RMSNormalization", [x, weight], [f"{name}.out"], "RmsNorm", shape=[tokens, h],
                  epsilon=1e-5, axis=-1)[0]


def _gemm(g: LayerGraph, name: str, x: str, out: int, inp: int, precision: Precision, flags: dict[str, str],
          tokens: int | str, row: bool = False) -> str:
    algo, gemm = precision.quant_algo, flags.get("gemm_plugin", "disable")
    shape: list[int | str] = [tokens, out]
    if algo == "W8A16":
        w = g.tensor(f"{name}.weight", "int8", [inp, out])
        return g.node(name, "WeightOnlyQuantMatmul", [x, w, g.tensor(f"{name}.per_channel_scale", g.dtype, [out])],
                      [f"{name}.out"], "quant_algo W8A16 (weight_only_quant_matmul_plugin)", PLUGIN, shape)[0]
    if algo and algo.startswith("W8A8_SQ_"):
        if row:  # no norm in front: the plugin quantizes the (smoothed) activation itself
            x = g.node(f"{name}.quantize", "QuantizePerToken" if "PER_TOKEN" in algo else "QuantizeTensor",
                       [x, g.tensor(f"{name}.smoother", "float32", [1, inp])], [f"{name}.in.int8"],
                       f"quant_algo {algo}", PLUGIN, [tokens, inp])[0]
        w = g.tensor(f"{name}.weight", "int8", [out, inp])
        return g.node(name, "SmoothQuantGemm", [x, w, g.tensor(f"{name}.per_channel_scale", "float32", [1, out])],
                      [f"{name}.out"], f"quant_algo {algo} (smooth_quant_gemm_plugin)", PLUGIN, shape)[0]
    if algo == "FP8":
        w = g.tensor(f"{name}.weight", "fp8", [out, inp])
        if gemm == "fp8":
            return g.node(name, "Gemm", [x, w], [f"{name}.out"], "--gemm_plugin fp8", PLUGIN, shape, type="fp8")[0]
        return g.node(name, "FP8QDQGemm", [x, w], [f"{name}.out"], "quant_algo FP8 (TensorRT Q/DQ fusion)", FUSED,
                      shape)[0]
    w = g.tensor(f"{name}.weight", g.dtype, [out, inp])
    if gemm != "disable":
        return g.node(name, "Gemm", [x, w], [f"{name}.out"], f"--gemm_plugin {gemm}", PLUGIN, shape,
                      type=g.dtype if gemm == "auto" else gemm, transb=1)[0]
    (wt,) = g.node(f"{name}.transpose", "Transpose", [w], [f"{name}.weight.t"], "--gemm_plugin disable",
                   perm=[1, 0])
    return g.node(name, "MatMul", [x, wt], [f"{name}.out"], "--gemm_plugin disable", shape=shape)[0]


def _mlp(g: LayerGraph, x: str, precision: Precision, flags: dict[str, str], tokens: int | str, h: int,
         inter: int) -> str:
    if flags.get("use_fused_mlp") == "enable":
        if flags.get("gemm_swiglu_plugin") == "fp8":
            w = g.tensor("mlp.fused_fc.weight", "fp8", [2 * inter, h])
            return g.node("mlp.fused_fc", "GemmSwiGLU", [x, w], ["mlp.swiglu"],
                          "--use_fused_mlp enable, --gemm_swiglu_plugin fp8", PLUGIN, [tokens, inter])[0]
        fused = _gemm(g, "mlp.fused_fc", x, 2 * inter, h, precision, flags, tokens)
        g.reasons["mlp.fused_fc"] += ", --use_fused_mlp enable (gate and fc in one GEMM)"
        up, gate = g.node("mlp.split", "Split", [fused], ["mlp.up", "mlp.gate_act_in"], "--use_fused_mlp enable",
                          axis=-1, num_outputs=2)
    else:
        why = (f"--use_fused_mlp {flags.get('use_fused_mlp')}" +
               (f" (quant_algo {precision.quant_algo} turns it off)" if precision.quant_algo not in (None, "FP8")
                else ""))
        gate = _gemm(g, "mlp.fc", x, inter, h, precision, flags, tokens)
        up = _gemm(g, "mlp.gate", x, inter, h, precision, flags, tokens)
        g.reasons["mlp.fc"] += f", {why}"
    (sig,) = g.node("mlp.sigmoid", "Sigmoid", [gate], ["mlp.sigmoid.out"], "SiLU = x·sigmoid(x)")
    (silu,) = g.node("mlp.silu", "Mul", [gate, sig], ["mlp.silu.out"], "SiLU")
    return g.node("mlp.swiglu", "Mul", [silu, up], ["mlp.swiglu.out"], "gated MLP", shape=[tokens, inter])[0]


def _reduce(g: LayerGraph, name: str, x: str, residual: str, tp_size: int, flags: dict[str, str],
            tokens: int | str, h: int, norm: str | None, out: str) -> tuple[str, str]:
    """All-reduce (tp > 1), residual add and (after attention) the post-attention norm."""
    fused = tp_size > 1 and flags.get("reduce_fusion") == "enable"
    if fused and norm:
        normed, summed = g.node(f"{name}.allreduce", "AllReduce", [x, residual, norm],
                                [f"{name}.normed", out], "--reduce_fusion enable (tp > 1)", PLUGIN,
                                [tokens, h], fusion_op="RESIDUAL_RMS_NORM", tp_size=tp_size)
        return normed, summed
    if fused:
        (summed,) = g.node(f"{name}.allreduce", "AllReduce", [x, residual], [out],
                           "--reduce_fusion enable (tp > 1)", PLUGIN, [tokens, h], fusion_op="RESIDUAL",
                           tp_size=tp_size)
        return summed, summed
    if tp_size > 1:
        (x,) = g.node(f"{name}.allreduce", "AllReduce", [x], [f"{name}.reduced"],
                      f"tp {tp_size} (--nccl_plugin {flags.get('nccl_plugin')})", PLUGIN, [tokens, h],
                      fusion_op="NONE", tp_size=tp_size)
    (summed,) = g.node(f"{name}.residual_add", "Add", [x, residual], [out], "residual", shape=[tokens, h])
    if norm is None:
        return summed, summed
    (normed,) = g.node(f"{name}.post_layernorm", "RMSNormalization", [summed, norm], [f"{name}.normed"], "RmsNorm",
                       shape=[tokens, h], epsilon=1e-5, axis=-1)
    return normed, summed


def to_onnx(g: LayerGraph) -> onnx.ModelProto:
    """The layer as a checked ONNX model."""
    last = g.nodes[-1].output[0]
    output = helper.make_tensor_value_info(last, ELEMENT[g.dtype], g.shapes.get(last))
    graph = helper.make_graph(g.nodes, "decoder_layer", g.inputs, [output])
    model = helper.make_model(graph, producer_name="trtllm-kit", opset_imports=[
        helper.make_opsetid("", ONNX_OPSET), helper.make_opsetid(PLUGIN, 1), helper.make_opsetid(FUSED, 1)])
    onnx.checker.check_model(model)
    return model


def fusion_table(g: LayerGraph) -> list[dict[str, Any]]:
    """One row per node: name, ``domain::op``, inputs, output shape and the flag that implies it."""
    return [{"node": n.name, "op": f"{n.domain}::{n.op_type}" if n.domain else n.op_type,
             "inputs": list(n.input), "shape": g.shapes.get(n.output[0]), "why": g.reasons[n.name]}
            for n in g.nodes]


def write_graph(g: LayerGraph, path: Path) -> Path:
    """Save the layer as ONNX at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(to_onnx(g), str(path))
    return path
