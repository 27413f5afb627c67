"""The per-layer math of the CPU runtime: rotary embedding, linear layers (plain or quantized with simulated
numerics), the TP reduction, the causal mask and attention.

Quantized linears follow the checkpoint's tensors, one line of math each: int8 weights are SmoothQuant (the
activation is divided by ``smoother`` when present, quantized to int8 statically with the preceding norm's
``scale_to_int`` or per token, multiplied exactly and rescaled); float8 weights are FP8 (activation and weight
round-tripped through ``float8_e4m3fn`` with their scaling factors). ``prepare_weights`` computes the float32
operand of each int8 or float8 weight once (``OPERAND``: the weight as float, times its scale for FP8), the values
every product would otherwise convert again, at 4 bytes a weight beside the stored one. W8A16 checkpoints hold
model-dtype weights: ``prepare_weights`` replaces them once with the int8 preview's dequantized values. A quantized
KV cache is simulated by ``kv_round_trip`` on the keys and values that enter the cache.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from trtllm_kit.errors import CheckpointError
from trtllm_kit.layout import LINEARS, NORM_INPUTS, ROW_LINEARS, split_name
from trtllm_kit.models.rope import ROPE_TYPES, inv_freq, rope_type
from trtllm_kit.quant import decoder_layer
from trtllm_kit.quant.awq import int4_dequantize
from trtllm_kit.quant.fp8 import FP8_DTYPE, fp8_round_trip
from trtllm_kit.quant.int8 import quantize_activation_int8, quantize_per_token_int8, w8a16_round_trip
from trtllm_kit.quant.kv import kv_round_trip
from trtllm_kit.runtime.products import PACKED, product

Weights = dict[str, torch.Tensor]
QUANT_ALGOS = (None, "W8A16", "FP8", "W8A8_SQ_PER_TENSOR_PLUGIN", "W8A8_SQ_PER_CHANNEL_PER_TENSOR_PLUGIN",
               "W8A8_SQ_PER_TENSOR_PER_TOKEN_PLUGIN", "W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN",
               "NVFP4",  # NVFP4: the loader dequantizes the weights, which then run as plain linears
               "W4A16_AWQ")  # W4A16 AWQ: dequantized (code · scale · prequant scale) by prepare_weights or the loader
KV_ALGOS = (None, "INT8", "FP8")
OPERAND = ".float_operand"  # beside ``{linear}.weight`` when it is int8 or float8: what the product multiplies
LINEAR_WEIGHTS = tuple(f"{module}.weight" for module in LINEARS)
PRODUCT_WEIGHTS = (*LINEAR_WEIGHTS, "lm_head.weight")  # stored in the product layout (``product_layout``)
AWQ_SCALES = (".weights_scaling_factor", ".prequant_scaling_factor")
SCALE_SUFFIXES = ("scale_to_int", "per_channel_scale", "act_scale", "smoother", "quantization_scaling_factor",
                  "weights_scaling_factor", "activation_scaling_factor", "kv_cache_scaling_factor")
# where a SmoothQuant linear finds its static activation scale, relative to the layer
ACT_SCALES = {**{module: f"{norm}.scale_to_int" for norm, modules in NORM_INPUTS.items() for module in modules},
              **ROW_LINEARS}


class Rope:
    """GPT-NeoX rotary embedding with ``rotary_base`` and ``rotary_scaling`` (the HF ``rope_scaling`` dict)."""

    def __init__(self, config: dict[str, Any], head_size: int, source: str = "config.json") -> None:
        """Arguments:
        config: the checkpoint config; head_size: the rotary dimension; source: for error messages.
        """
        self.dim = head_size
        self.base = float(config.get("rotary_base", 10000.0))
        self.max_positions = int(config.get("max_position_embeddings") or 2048)
        self.scaling = dict(config.get("rotary_scaling") or {})
        self.rope_type = rope_type(self.scaling)
        if self.rope_type not in ROPE_TYPES:
            raise CheckpointError(f"{source} has rotary_scaling of type {self.rope_type!r}, which the CPU "
                                  f"runtime does not implement (it supports {', '.join(ROPE_TYPES)}).")
        self._inv_freqs: dict[int, torch.Tensor] = {}
        self._last_angles: tuple[torch.Tensor, int, torch.Tensor, torch.Tensor] | None = None
        self._last_signed: tuple[torch.Tensor, torch.Tensor] | None = None  # (sin, sin with its first half negated)

    def inv_freq(self, seq_len: int) -> torch.Tensor:
        """Inverse frequencies [dim/2] in float32, computed as transformers computes them (``models/rope.py``),
        once per distinct value.

        Arguments:
            seq_len: tokens in the sequence; only "dynamic" scaling depends on it.
        """
        key = self._frequency_key(seq_len)
        if key not in self._inv_freqs:
            self._inv_freqs[key] = inv_freq(self.dim, self.base, self.scaling, self.max_positions, seq_len)
        return self._inv_freqs[key]

    def angles(self, positions: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [B, 1, T, dim] in float32 of ``positions``; the last pair is kept, so that the layers of a
        forward pass, which rotate the same positions tensor, compute them once.

        Arguments:
            positions: [B, T] token positions (not changed in place once given); seq_len: for dynamic scaling.
        """
        key, last = self._frequency_key(seq_len), self._last_angles
        if last is not None and last[0] is positions and last[1] == key:
            return last[2], last[3]
        freqs = positions.float()[:, None, :, None] * self.inv_freq(seq_len)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        self._last_angles = (positions, key, cos, sin)
        return cos, sin

    def rotate(self, x: torch.Tensor, positions: torch.Tensor, seq_len: int) -> torch.Tensor:
        """Rotate ``x`` [B, heads, T, dim] in float32 (as the attention kernel does), rounded back to its dtype.

        Arguments:
            x: queries or keys; positions: [B, T] token positions; seq_len: for dynamic scaling.
        """
        cos, sin = self.angles(positions, seq_len)
        xf, half = as_float32(x), x.shape[-1] // 2
        if self._last_signed is None or self._last_signed[0] is not sin:
            self._last_signed = (sin, torch.cat((-sin[..., :half], sin[..., half:]), dim=-1))
        # [-x2, x1] * sin as [x2, x1] * [-sin1, sin2]: a negation is exact, so the same bits with fewer ops a layer
        rotated = xf * cos + xf.roll(half, -1) * self._last_signed[1]
        return rotated if x.dtype == torch.float32 else rotated.to(x.dtype)

    def _frequency_key(self, seq_len: int) -> int:
        """``seq_len`` where the frequencies depend on it (dynamic scaling past the trained length), else 0."""
        return seq_len if self.rope_type == "dynamic" and seq_len > self.max_positions else 0


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm with transformers' arithmetic (``quant.decoder_layer.rms_norm``); in float32 torch's one fused call,
    which rounds the same way (``tests/runtime/test_layers.py``) without the chain of small ops.

    Arguments:
        x: hidden states [..., H]; weight: the scale [H]; eps: the norm's epsilon.
    """
    if x.dtype == weight.dtype == torch.float32:
        return torch.nn.functional.rms_norm(x, weight.shape, weight, eps)
    return decoder_layer.rms_norm(x, weight, eps)


def fuse_gate_up(weights: Weights, layer_prefix: str) -> torch.Tensor | None:
    """A layer's ``mlp.fc`` and ``mlp.gate`` weights as one [fc rows + gate rows, in] tensor for one matmul (each
    output column is the same dot product as alone: the same bits); the two entries of ``weights`` become views of
    its halves, so the weights are held once. None when there is nothing to fuse: no ``mlp.gate`` (``swiglu``
    holds both in ``mlp.fc``), a quantized weight or a bias.

    Arguments:
        weights: a rank's prepared tensors (changed in place); layer_prefix: ``transformer.layers.{i}``.
    """
    names = [f"{layer_prefix}.mlp.{module}.weight" for module in ("fc", "gate")]
    fc, gate = (weights.get(name) for name in names)
    has_bias = any(f"{layer_prefix}.mlp.{module}.bias" in weights for module in ("fc", "gate"))
    if fc is None or gate is None or fc.shape != gate.shape or fc.dtype != gate.dtype \
            or fc.dtype in (torch.int8, FP8_DTYPE) or has_bias:
        return None
    fused = torch.cat([fc.t(), gate.t()], dim=1).t()  # kept in the product layout (``product_layout``)
    weights[names[0]], weights[names[1]] = fused.split([fc.shape[0], gate.shape[0]])
    return fused


def linear(x: torch.Tensor, weights: Weights, prefix: str, *, with_bias: bool = True) -> torch.Tensor:
    """``x @ W.T (+ b)`` of layer ``prefix`` on one rank, with simulated int8 or FP8 numerics for quantized weights.

    Arguments:
        x: activations [..., in] in the compute dtype; weights: the rank's tensors; prefix: the name without
        ``.weight``; with_bias: False for row-parallel layers, whose bias is added after the reduction.
    """
    weight = weights[f"{prefix}.weight"]
    if weight.dtype == torch.int8:
        out = _smoothquant_linear(x, weights[prefix + OPERAND], weights, prefix).to(x.dtype)
    elif weight.dtype == FP8_DTYPE:
        xq = fp8_round_trip(x, weights[f"{prefix}.activation_scaling_factor"])
        out = torch.nn.functional.linear(xq, weights[prefix + OPERAND]).to(x.dtype)
    else:
        out = product(x, weight, weights.get(f"{prefix}.weight{PACKED}"))
    bias = weights.get(f"{prefix}.bias") if with_bias else None
    return out if bias is None else out + bias


def _smoothquant_linear(x: torch.Tensor, weight: torch.Tensor, weights: Weights, prefix: str) -> torch.Tensor:
    """The SmoothQuant plugin GEMM: int8 activations × int8 weights (``weight``: their float32 values), rescaled
    (float32 result)."""
    smoother = weights.get(f"{prefix}.smoother")
    xs = x.float() if smoother is None else x.float() / smoother.reshape(-1)
    channel = weights[f"{prefix}.per_channel_scale"].reshape(-1)
    act_scale = weights.get(f"{prefix}.act_scale")
    if act_scale is None:  # per token, dynamic
        qx, token_scale = quantize_per_token_int8(xs)
        return torch.nn.functional.linear(qx, weight) * token_scale * channel
    base, module, _ = split_name(f"{prefix}.weight")
    qx = quantize_activation_int8(xs, weights[base + ACT_SCALES[module]])
    return torch.nn.functional.linear(qx, weight) * channel * act_scale.reshape(-1)


def prepare_weights(tensors: Weights, quantization: dict[str, Any], compute_dtype: torch.dtype) -> Weights:
    """A rank's tensors ready to run: scales stay float32, int8/float8 weights stay as stored with their float32
    operand beside them (``OPERAND``), W8A16 weights become the dequantized int8 preview, W4A16 AWQ weights their
    dequantized values times the prequant scale (the scales then go), everything else is cast to the compute
    dtype.

    Arguments:
        tensors: the rank file's tensors; quantization: the config's ``quantization`` object; compute_dtype: the
        compute dtype.
    """
    is_w8a16 = quantization.get("quant_algo") == "W8A16"
    is_awq = quantization.get("quant_algo") == "W4A16_AWQ"
    prepared = {}
    for name, tensor in tensors.items():
        if is_awq and name.endswith(AWQ_SCALES):
            continue
        if is_awq and name.endswith(LINEAR_WEIGHTS) and tensor.dtype == torch.int8:  # (the llmapi loader's are
            # dequantized already)
            prefix = name.removesuffix(".weight")
            weight = int4_dequantize(tensor.view(torch.uint8), tensors[f"{prefix}.weights_scaling_factor"])
            prepared[name] = (weight * tensors[f"{prefix}.prequant_scaling_factor"].float()).to(compute_dtype)
        elif tensor.dtype in (torch.int8, FP8_DTYPE):
            prepared[name] = tensor
            if name.endswith(".weight"):
                prefix = name.removesuffix(".weight")
                operand = tensor.float()
                prepared[prefix + OPERAND] = operand if tensor.dtype == torch.int8 \
                    else operand * tensors[f"{prefix}.weights_scaling_factor"].float()
        elif name.endswith(SCALE_SUFFIXES):
            prepared[name] = tensor.float()
        elif is_w8a16 and name.endswith(LINEAR_WEIGHTS):
            prepared[name] = w8a16_round_trip(tensor).to(compute_dtype)
        else:
            prepared[name] = tensor.to(compute_dtype)
        if name.endswith(PRODUCT_WEIGHTS) and prepared[name].dtype == compute_dtype:
            prepared[name] = product_layout(prepared[name])
    return prepared


def product_layout(weight: torch.Tensor) -> torch.Tensor:
    """A plain weight [out, in] as the view of its transpose stored row by row: the same shape and values, but
    ``x @ W.T`` then multiplies by a contiguous [in, out] matrix, which MKL does faster at several rows than the
    transposed [out, in] one (SmolLM2's step products at 8 rows, 1.2-1.3x: ``benchmarks/linear_layouts.py``).
    Each product rounds as the one of that layout; every path of the runtime multiplies the same tensors.

    Arguments:
        weight: a linear's weight [out, in] in the compute dtype.
    """
    return weight.t().contiguous().t()


def check_quantization(quantization: dict[str, Any], source: str) -> None:
    """Refuse a ``quantization`` block the CPU runtime does not simulate.

    Arguments:
        quantization: the config's ``quantization`` object; source: for error messages.
    """
    algo, kv = quantization.get("quant_algo"), quantization.get("kv_cache_quant_algo")
    if algo not in QUANT_ALGOS or kv not in KV_ALGOS:
        raise CheckpointError(f"{source} is quantized with {algo} (KV cache {kv}); the CPU runtime simulates "
                              f"{', '.join(a for a in QUANT_ALGOS if a)} with a KV cache of none, INT8 or FP8.")


def kv_cache(weights: Weights, layer_prefix: str, algo: str | None,
             k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values as a quantized KV cache returns them (unchanged when the cache is not quantized).

    Arguments:
        weights: the rank's tensors; layer_prefix: ``transformer.layers.{i}``; algo: the KV algorithm or None;
        k, v: [B, heads, T, d].
    """
    if algo is None:
        return k, v
    scale = weights[f"{layer_prefix}.attention.kv_cache_scaling_factor"]
    return kv_round_trip(k, scale, algo), kv_round_trip(v, scale, algo)


def reduce(partials: list[torch.Tensor], bias: torch.Tensor | None = None) -> torch.Tensor:
    """The TP all-reduce of row-parallel partial sums (accumulated in float32), then the row bias once.

    Arguments:
        partials: one output per TP rank in the compute dtype; bias: the replicated row bias, or None.
    """
    if len(partials) == 1:  # the sum of one term, as the stack's sum rounds it (-0.0 becomes 0.0)
        total = partials[0] + 0.0
    else:
        total = torch.stack([p.float() for p in partials]).sum(0).to(partials[0].dtype)
    return total if bias is None else total + bias


def causal_mask(num_queries: int, num_keys: int) -> torch.Tensor:
    """Boolean [num_queries, num_keys], True where visible; the queries are the last ``num_queries`` keys.

    Arguments:
        num_queries: new tokens; num_keys: cached plus new tokens.
    """
    return torch.arange(num_keys)[None, :] <= torch.arange(num_queries)[:, None] + (num_keys - num_queries)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Scaled dot-product attention of one rank with grouped KV heads, as fused attention kernels round it:
    scores and softmax in float32, probabilities rounded to the compute dtype for the product with ``v``.

    Arguments:
        q: [B, Hq_r, T, d]; k, v: [B, Hkv_r, S, d]; mask: boolean, broadcastable to [B, Hq_r, T, S] (None: every
        key visible, as an all-True mask).
    """
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = torch.matmul(as_float32(q), as_float32(k).transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    probs = torch.softmax(scores if mask is None else scores.masked_fill(~mask, float("-inf")), dim=-1)
    return torch.matmul(probs if q.dtype == torch.float32 else probs.to(q.dtype), v)


def as_float32(x: torch.Tensor) -> torch.Tensor:
    """``x.float()`` without the call when ``x`` is float32 already (the same tensor: one dispatch fewer).

    Arguments:
        x: any floating tensor.
    """
    return x if x.dtype == torch.float32 else x.float()
