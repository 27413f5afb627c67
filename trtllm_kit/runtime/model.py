"""A TensorRT-LLM checkpoint executed on the CPU the way the GPUs would run it.

Every tensor-parallel rank computes with its own shard; row-parallel outputs (``attention.dense``,
``mlp.proj``) are partial sums reduced across the ranks before the row bias is added once; ``lm_head``
shards are gathered and the vocabulary padding is stripped; pipeline stages run one after the other.
The per-layer pieces (``embed``, ``norm``, ``qkv``, ``attend``, ``attention_output``, ``mlp``, ``logits``)
are public so that a runtime with a paged KV cache can call them on its own tensors.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from trtllm_kit.errors import CheckpointError

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
ROPE_TYPES = ("linear", "dynamic", "llama3")
Weights = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Dims:
    """The sizes the forward pass needs, read from a checkpoint ``config.json``."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    intermediate_size: int
    norm_epsilon: float
    tp_size: int
    pp_size: int

    @property
    def num_heads_per_rank(self) -> int:
        return self.num_heads // self.tp_size

    @property
    def num_kv_heads_per_rank(self) -> int:
        return -(-self.num_kv_heads // self.tp_size)  # ceil: KV heads are duplicated when fewer than tp

    def layers_for_stage(self, pp_rank: int) -> list[int]:
        """The global layers of a pipeline stage (TensorRT-LLM 1.x: ``tensor_split``)."""
        return torch.tensor_split(torch.arange(self.num_layers), self.pp_size)[pp_rank].tolist()

    @classmethod
    def from_config(cls, config: dict[str, Any], source: str) -> Dims:
        """Validate a checkpoint config and read its sizes.

        Arguments:
            config: the parsed ``config.json``; source: its path, for error messages.
        """
        if config.get("architecture") not in ARCHITECTURES:
            raise CheckpointError(f"{source} has architecture {config.get('architecture')!r}; the CPU "
                                  f"runtime runs {', '.join(ARCHITECTURES)}.")
        quant = config.get("quantization") or {}
        if quant.get("quant_algo") or quant.get("kv_cache_quant_algo"):
            raise CheckpointError(f"{source} is quantized ({quant.get('quant_algo')}, KV cache "
                                  f"{quant.get('kv_cache_quant_algo')}); the CPU runtime runs unquantized "
                                  "checkpoints only: convert again without quantization.")
        for key, want in (("position_embedding_type", "rope_gpt_neox"), ("hidden_act", "silu")):
            if config.get(key, want) != want:
                raise CheckpointError(f"{source} has {key} {config[key]!r}; the CPU runtime needs {want!r}.")
        mapping = config.get("mapping") or {}
        tp, pp = int(mapping.get("tp_size", 1)), int(mapping.get("pp_size", 1))
        if int(mapping.get("world_size", tp * pp)) != tp * pp:
            raise CheckpointError(f"{source} has mapping.world_size {mapping['world_size']} but tp_size {tp} "
                                  f"× pp_size {pp} = {tp * pp}; the config is inconsistent: convert again.")
        try:
            heads, hidden = int(config["num_attention_heads"]), int(config["hidden_size"])
            dims = cls(vocab_size=int(config["vocab_size"]), hidden_size=hidden,
                       num_layers=int(config["num_hidden_layers"]), num_heads=heads,
                       num_kv_heads=int(config.get("num_key_value_heads") or heads),
                       head_size=int(config.get("head_size") or hidden // heads),
                       intermediate_size=int(config["intermediate_size"]),
                       norm_epsilon=float(config.get("norm_epsilon", 1e-5)), tp_size=tp, pp_size=pp)
        except KeyError as missing:
            raise CheckpointError(f"{source} lacks the key {missing.args[0]!r}.") from None
        kv = dims.num_kv_heads
        if heads % tp or dims.intermediate_size % tp or (kv % tp if kv >= tp else tp % kv) or pp > dims.num_layers:
            raise CheckpointError(f"{source}: {heads} heads, {kv} KV heads, intermediate size "
                                  f"{dims.intermediate_size} and {dims.num_layers} layers cannot be split "
                                  f"over tp_size {tp} and pp_size {pp}.")
        return dims


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
        self.rope_type = self.scaling.get("rope_type", self.scaling.get("type", "default"))
        if self.rope_type not in ("default", *ROPE_TYPES):
            raise CheckpointError(f"{source} has rotary_scaling of type {self.rope_type!r}, which the CPU "
                                  f"runtime does not implement (it supports none, {', '.join(ROPE_TYPES)}).")

    def inv_freq(self, seq_len: int) -> torch.Tensor:
        """Inverse frequencies [dim/2] in float32, computed as transformers computes them.

        Arguments:
            seq_len: tokens in the sequence; only "dynamic" scaling depends on it.
        """
        base, s = self.base, self.scaling
        if self.rope_type == "dynamic" and seq_len > self.max_positions:
            factor = float(s["factor"])
            base *= (factor * seq_len / self.max_positions - (factor - 1)) ** (self.dim / (self.dim - 2))
        inv_freq = 1.0 / (base ** (torch.arange(0, self.dim, 2, dtype=torch.int64).float() / self.dim))
        if self.rope_type == "linear":
            return inv_freq / float(s["factor"])
        if self.rope_type != "llama3":
            return inv_freq
        factor, low, high = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
        old_len = int(s.get("original_max_position_embeddings") or self.max_positions)
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
        return torch.where(is_medium, smoothed, scaled)

    def rotate(self, x: torch.Tensor, positions: torch.Tensor, seq_len: int) -> torch.Tensor:
        """Rotate ``x`` [B, heads, T, dim] in float32 (as the attention kernel does), rounded back to its dtype.

        Arguments:
            x: queries or keys; positions: [B, T] token positions; seq_len: for dynamic scaling.
        """
        freqs = positions.float()[:, None, :, None] * self.inv_freq(seq_len)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        xf, half = x.float(), x.shape[-1] // 2
        rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
        return (xf * cos + rotated * sin).to(x.dtype)


def linear(x: torch.Tensor, weights: Weights, prefix: str, *, with_bias: bool = True) -> torch.Tensor:
    """``x @ W.T (+ b)`` of layer ``prefix`` on one rank: the one place where dequantization will slot in.

    Arguments:
        x: activations [..., in] in the compute dtype; weights: the rank's tensors; prefix: the name without
        ``.weight``; with_bias: False for row-parallel layers, whose bias is added after the reduction.
    """
    # Quantized checkpoints (W8A16, SmoothQuant, FP8) will dequantize here from ``{prefix}.*scale*`` tensors.
    bias = weights.get(f"{prefix}.bias") if with_bias else None
    return torch.nn.functional.linear(x, weights[f"{prefix}.weight"], bias)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in float32, rounded to ``x.dtype`` before the scale (as transformers does).

    Arguments:
        x: hidden states; weight: the scale; eps: ``norm_epsilon``.
    """
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def reduce(partials: list[torch.Tensor], bias: torch.Tensor | None = None) -> torch.Tensor:
    """The TP all-reduce of row-parallel partial sums (accumulated in float32), then the row bias once.

    Arguments:
        partials: one output per TP rank in the compute dtype; bias: the replicated row bias, or None.
    """
    total = torch.stack([p.float() for p in partials]).sum(0).to(partials[0].dtype)
    return total if bias is None else total + bias


def causal_mask(num_queries: int, num_keys: int) -> torch.Tensor:
    """Boolean [num_queries, num_keys], True where visible; the queries are the last ``num_queries`` keys.

    Arguments:
        num_queries: new tokens; num_keys: cached plus new tokens.
    """
    return torch.arange(num_keys)[None, :] <= torch.arange(num_queries)[:, None] + (num_keys - num_queries)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Scaled dot-product attention of one rank with grouped KV heads, as fused attention kernels round it:
    scores and softmax in float32, probabilities rounded to the compute dtype for the product with ``v``.

    Arguments:
        q: [B, Hq_r, T, d]; k, v: [B, Hkv_r, S, d]; mask: boolean, broadcastable to [B, Hq_r, T, S].
    """
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return torch.matmul(probs.to(q.dtype), v)


class CheckpointModel:
    """The weights of every rank of a TensorRT-LLM checkpoint, and the math that runs them."""

    def __init__(self, config: dict[str, Any], ranks: list[Weights], dtype: torch.dtype, source: str) -> None:
        """Arguments:
        config: ``config.json``; ranks: the tensors of rank ``tp_rank + tp_size * pp_rank`` in the compute
        dtype; dtype: the compute dtype; source: the checkpoint directory, for error messages.
        """
        self.config = config
        self.dims = Dims.from_config(config, source)
        self.rope = Rope(config, self.dims.head_size, source)
        self.dtype = dtype
        self.ranks = ranks
        self.layer_places = [(p, i) for p in range(self.dims.pp_size)
                             for i, _ in enumerate(self.dims.layers_for_stage(p))]
        # A split table (use_parallel_embedding) is gathered once: per-rank lookups followed by the GPU's
        # all-reduce (vocab rows) or all-gather (hidden columns) give exactly the full table's rows.
        tables = [self.weights(0, r)["transformer.vocab_embedding.weight"] for r in range(self.dims.tp_size)]
        if not config.get("use_parallel_embedding"):
            self.embedding = tables[0]
        elif int(config.get("embedding_sharding_dim", 0)) == 1:
            self.embedding = torch.cat(tables, dim=1)
        else:
            self.embedding = torch.cat(tables)[: self.dims.vocab_size]

    @classmethod
    def load(cls, ckpt_dir: Path, compute_dtype: torch.dtype = torch.float32) -> CheckpointModel:
        """Read ``config.json`` and every ``rank{N}.safetensors``, checking tensor names and shapes.

        Arguments:
            ckpt_dir: a TensorRT-LLM checkpoint directory.
            compute_dtype: float32, or the checkpoint dtype to reproduce the GPU's rounding.
        """
        ckpt_dir = Path(ckpt_dir)
        config_path = ckpt_dir / "config.json"
        if not config_path.is_file():
            raise CheckpointError(f"{ckpt_dir} has no config.json; point at a TensorRT-LLM checkpoint.")
        try:
            config = json.loads(config_path.read_text())
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"{config_path} is not valid JSON ({exc.msg}, line {exc.lineno}).") from None
        dims = Dims.from_config(config, str(config_path))
        ranks = []
        for rank in range(dims.tp_size * dims.pp_size):
            path = ckpt_dir / f"rank{rank}.safetensors"
            if not path.is_file():
                raise CheckpointError(f"{path} is missing: the config's mapping needs "
                                      f"{dims.tp_size * dims.pp_size} rank files; convert the checkpoint again.")
            try:
                tensors = load_file(path)
            except (SafetensorError, OSError) as exc:
                raise CheckpointError(f"{path} cannot be read as safetensors ({exc}).") from None
            _check_rank(tensors, _expected_shapes(config, dims, rank // dims.tp_size), path)
            ranks.append(tensors)
        _check_replicas(ranks, config, dims, ckpt_dir)
        ranks = [{name: t.to(compute_dtype) for name, t in tensors.items()} for tensors in ranks]
        return cls(config, ranks, compute_dtype, str(ckpt_dir))

    def weights(self, pp_rank: int, tp_rank: int) -> Weights:
        """The tensors of one rank.

        Arguments:
            pp_rank: the pipeline stage; tp_rank: the tensor-parallel rank.
        """
        return self.ranks[tp_rank + self.dims.tp_size * pp_rank]

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings [B, T, H].

        Arguments:
            input_ids: [B, T] token ids.
        """
        return torch.nn.functional.embedding(input_ids, self.embedding)

    def norm(self, layer: int, name: str, x: torch.Tensor) -> torch.Tensor:
        """``input_layernorm`` or ``post_layernorm`` of a layer (replicated, so rank 0's copy).

        Arguments:
            layer: global layer number; name: the norm; x: hidden states [B, T, H].
        """
        pp_rank, local = self.layer_places[layer]
        weight = self.weights(pp_rank, 0)[f"transformer.layers.{local}.{name}.weight"]
        return rms_norm(x, weight, self.dims.norm_epsilon)

    def qkv(self, layer: int, tp_rank: int, x: torch.Tensor, positions: torch.Tensor,
            seq_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One rank's queries and keys (rotated) and values, each [B, heads_r, T, d].

        Arguments:
            layer: global layer number; tp_rank: the rank; x: normalized hidden states [B, T, H];
            positions: [B, T] token positions; seq_len: tokens in the sequence (for dynamic rope scaling).
        """
        pp_rank, local = self.layer_places[layer]
        out = linear(x, self.weights(pp_rank, tp_rank), f"transformer.layers.{local}.attention.qkv")
        d, hq, hkv = self.dims.head_size, self.dims.num_heads_per_rank, self.dims.num_kv_heads_per_rank
        q, k, v = (t.unflatten(-1, (-1, d)).transpose(1, 2) for t in out.split([hq * d, hkv * d, hkv * d], -1))
        return self.rope.rotate(q, positions, seq_len), self.rope.rotate(k, positions, seq_len), v

    def attention_output(self, layer: int, contexts: list[torch.Tensor]) -> torch.Tensor:
        """``attention.dense`` of every rank's context [B, Hq_r, T, d], reduced across TP.

        Arguments:
            layer: global layer number; contexts: ``attend``'s output for each TP rank.
        """
        pp_rank, local = self.layer_places[layer]
        prefix = f"transformer.layers.{local}.attention.dense"
        partials = [linear(c.transpose(1, 2).flatten(2), self.weights(pp_rank, r), prefix, with_bias=False)
                    for r, c in enumerate(contexts)]
        return reduce(partials, self.weights(pp_rank, 0).get(f"{prefix}.bias"))

    def mlp(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """``proj(silu(fc(x)) * gate(x))`` on every rank, reduced across TP.

        Arguments:
            layer: global layer number; x: normalized hidden states [B, T, H].
        """
        pp_rank, local = self.layer_places[layer]
        prefix = f"transformer.layers.{local}.mlp"
        partials = []
        for r in range(self.dims.tp_size):
            w = self.weights(pp_rank, r)
            act = torch.nn.functional.silu(linear(x, w, f"{prefix}.fc")) * linear(x, w, f"{prefix}.gate")
            partials.append(linear(act, w, f"{prefix}.proj", with_bias=False))
        return reduce(partials, self.weights(pp_rank, 0).get(f"{prefix}.proj.bias"))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``ln_f`` and the gathered ``lm_head`` shards of the last stage, padding stripped, in float32.

        Arguments:
            hidden: the last layer's output [B, T, H].
        """
        last = self.dims.pp_size - 1
        x = rms_norm(hidden, self.weights(last, 0)["transformer.ln_f.weight"], self.dims.norm_epsilon)
        shards = [linear(x, self.weights(last, r), "lm_head") for r in range(self.dims.tp_size)]
        return torch.cat(shards, dim=-1)[..., : self.dims.vocab_size].float()

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, vocab_size] in float32 of whole sequences under a causal mask.

        Arguments:
            input_ids: [B, T] int64 token ids.
        """
        batch, seq_len = input_ids.shape
        positions = torch.arange(seq_len).expand(batch, seq_len)
        mask = causal_mask(seq_len, seq_len)
        hidden = self.embed(input_ids)
        for layer in range(self.dims.num_layers):
            x = self.norm(layer, "input_layernorm", hidden)
            contexts = [attend(*self.qkv(layer, r, x, positions, seq_len), mask)
                        for r in range(self.dims.tp_size)]
            hidden = hidden + self.attention_output(layer, contexts)
            hidden = hidden + self.mlp(layer, self.norm(layer, "post_layernorm", hidden))
        return self.logits(hidden)


def _expected_shapes(config: dict[str, Any], dims: Dims, pp_rank: int) -> dict[str, tuple[int, ...]]:
    """Name → shape of every tensor that the file of a rank on stage ``pp_rank`` must hold."""
    h, tp, i_r = dims.hidden_size, dims.tp_size, dims.intermediate_size // dims.tp_size
    qkv_rows = (dims.num_heads_per_rank + 2 * dims.num_kv_heads_per_rank) * dims.head_size
    shapes = {"input_layernorm.weight": (h,), "attention.qkv.weight": (qkv_rows, h),
              "attention.dense.weight": (h, dims.num_heads_per_rank * dims.head_size),
              "post_layernorm.weight": (h,), "mlp.fc.weight": (i_r, h), "mlp.gate.weight": (i_r, h),
              "mlp.proj.weight": (h, i_r)}
    is_qwen2 = config["architecture"] == "Qwen2ForCausalLM"
    if config.get("attn_bias") or is_qwen2:
        shapes["attention.qkv.bias"] = (qkv_rows,)
        if not is_qwen2:  # Llama's attention_bias also covers o_proj; Qwen2 has q/k/v biases only
            shapes["attention.dense.bias"] = (h,)
    if config.get("mlp_bias"):
        shapes.update({"mlp.fc.bias": (i_r,), "mlp.gate.bias": (i_r,), "mlp.proj.bias": (h,)})
    expected = {f"transformer.layers.{i}.{name}": shape
                for i in range(len(dims.layers_for_stage(pp_rank))) for name, shape in shapes.items()}
    if pp_rank == 0:
        vocab, hidden = dims.vocab_size, h
        if config.get("use_parallel_embedding"):  # split by padded vocab rows (dim 0) or hidden columns (1)
            vocab, hidden = ((-(-vocab // tp), h) if int(config.get("embedding_sharding_dim", 0)) == 0
                             else (vocab, h // tp))
        expected["transformer.vocab_embedding.weight"] = (vocab, hidden)
    if pp_rank == dims.pp_size - 1:
        expected["transformer.ln_f.weight"] = (h,)
        expected["lm_head.weight"] = (-(-dims.vocab_size // tp), h)
    return expected


def _check_rank(tensors: Weights, expected: dict[str, tuple[int, ...]], path: Path) -> None:
    """Raise ``CheckpointError`` naming the file and the first missing or misshapen tensor."""
    missing = [name for name in expected if name not in tensors]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"{path} lacks the tensor {missing[0]!r}{more}; convert the checkpoint again.")
    for name, shape in expected.items():
        if tuple(tensors[name].shape) != shape:
            raise CheckpointError(f"{path}: tensor {name!r} has shape {list(tensors[name].shape)}, but "
                                  f"config.json implies {list(shape)}.")


def _check_replicas(ranks: list[Weights], config: dict[str, Any], dims: Dims, ckpt_dir: Path) -> None:
    """Replicated tensors (norms, row biases, the unsplit embedding) must be equal on every TP rank of a stage:
    the runtime reads rank 0's copy, while GPUs would silently diverge."""
    replicated = ("layernorm.weight", "ln_f.weight", "dense.bias", "proj.bias")
    if not config.get("use_parallel_embedding"):
        replicated += ("vocab_embedding.weight",)
    for rank, tensors in enumerate(ranks):
        first = ranks[rank - rank % dims.tp_size]
        for name in (n for n in tensors if n.endswith(replicated) and tensors is not first):
            if not torch.isclose(tensors[name], first[name], rtol=0, atol=0, equal_nan=True).all():
                raise CheckpointError(f"{ckpt_dir}: the replicated tensor {name!r} differs between "
                                      f"rank{rank - rank % dims.tp_size}.safetensors and rank{rank}.safetensors; "
                                      "convert the checkpoint again.")
