"""A TensorRT-LLM checkpoint executed on the CPU the way the GPUs would run it.

Every tensor-parallel rank computes with its own shard; row-parallel outputs (``attention.dense``,
``mlp.proj``) are partial sums reduced across the ranks before the row bias is added once; ``lm_head``
shards are gathered and the vocabulary padding is stripped; pipeline stages run one after the other.
The per-layer pieces (``embed``, ``norm``, ``qkv``, ``attend``, ``attention_output``, ``mlp``, ``logits``)
are public so that a runtime with a paged KV cache can call them on its own tensors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from trtllm_kit.errors import CheckpointError
from trtllm_kit.jsonfile import read_json
from trtllm_kit.models.base import Activation, Family
from trtllm_kit.models.registry import family_of_checkpoint
from trtllm_kit.runtime.checkpoint_checks import check_quantized, check_rank, check_replicas, expected_tensors
from trtllm_kit.runtime.dims import NORMS, Dims
from trtllm_kit.runtime.layers import (  # noqa: F401 (re-exported: the runtime's public per-layer math)
    LINEAR_WEIGHTS,
    PRODUCT_WEIGHTS,
    ROPE_TYPES,
    Rope,
    Weights,
    attend,
    causal_mask,
    check_quantization,
    fuse_gate_up,
    kv_cache,
    linear,
    prepare_weights,
    reduce,
)
from trtllm_kit.runtime.lora import LoraBatch, rank_parts
from trtllm_kit.runtime.products import PACKED, can_pack, pack, product


class CheckpointModel:
    """The weights of every rank of a TensorRT-LLM checkpoint, and the math that runs them."""

    def __init__(self, config: dict[str, Any], ranks: list[Weights], dtype: torch.dtype, source: str) -> None:
        """Arguments:
        config: ``config.json``; ranks: the tensors of rank ``tp_rank + tp_size * pp_rank`` in the compute
        dtype; dtype: the compute dtype; source: the checkpoint directory, for error messages.
        """
        self.config = config
        self.dims = Dims.from_config(config, source)
        self.family: Family = family_of_checkpoint(config["architecture"], source)
        self.norm_fn = NORMS[self.family.norm]
        self.rope = Rope(config, self.dims.head_size, source)
        self.kv_cache_quant_algo = (config.get("quantization") or {}).get("kv_cache_quant_algo")
        self.dtype = dtype
        self.ranks = ranks
        self.mapping = self.dims.mapping
        self.layer_places = [(p, i) for p in range(self.dims.pp_size)
                             for i, _ in enumerate(self.dims.layers_for_stage(p))]
        self.lora_parts = [rank_parts(config, self.dims.tp_size, r) for r in range(self.dims.tp_size)]
        self.gate_up = {(p, r, i): fused for p in range(self.dims.pp_size) for r in range(self.dims.tp_size)
                        for i, _ in enumerate(self.dims.layers_for_stage(p))  # (pp_rank, tp_rank, local layer)
                        if (fused := fuse_gate_up(self.weights(p, r), f"transformer.layers.{i}")) is not None}
        self.gate_up_packed: dict[tuple[int, int, int], torch.Tensor] = {}  # ``pack_products``: each one's copy
        # A split table (use_parallel_embedding) is gathered once: per-rank lookups followed by the GPU's
        # all-reduce (vocab rows) or all-gather (hidden columns) give exactly the full table's rows.
        tables = [self.weights(0, r)["transformer.vocab_embedding.weight"] for r in range(self.dims.tp_size)]
        if not config.get("use_parallel_embedding"):
            self.embedding = tables[0]
        elif int(config.get("embedding_sharding_dim", 0)) == 1:
            self.embedding = torch.cat(tables, dim=1)
        else:
            self.embedding = torch.cat(tables)[: self.dims.vocab_size]
        self.pack_products()

    @classmethod
    def load(cls, ckpt_dir: Path, compute_dtype: torch.dtype = torch.float32) -> CheckpointModel:
        """Read ``config.json`` and every ``rank{N}.safetensors``, checking tensor names and shapes.

        Arguments:
            ckpt_dir: a TensorRT-LLM checkpoint directory.
            compute_dtype: float32, or the checkpoint dtype to reproduce the GPU's rounding.
        """
        ckpt_dir = Path(ckpt_dir)
        config_path = ckpt_dir / "config.json"
        config = read_json(config_path, f"{ckpt_dir} has no config.json; point at a TensorRT-LLM checkpoint.",
                           CheckpointError)
        dims = Dims.from_config(config, str(config_path))
        plain, full = expected_tensors(config, dims.mapping, str(config_path))
        ranks = []
        for rank in dims.mapping.ranks():
            path = ckpt_dir / f"rank{rank}.safetensors"
            if not path.is_file():
                raise CheckpointError(f"{path} is missing: the config's mapping needs "
                                      f"{dims.mapping.world_size} rank files; convert the checkpoint again.")
            try:
                tensors = load_file(path)
            except (SafetensorError, OSError) as exc:
                raise CheckpointError(f"{path} cannot be read as safetensors ({exc}).") from None
            # names from the plain layout, shapes from the quantized one (packed int4 halves a weight's rows)
            check_rank(tensors, {name: full[rank].get(name, spec) for name, spec in plain[rank].items()}, path)
            check_quantized(tensors, full[rank], plain[rank], config.get("quantization") or {}, path)
            ranks.append(tensors)
        check_replicas(ranks, config, dims.mapping, ckpt_dir)
        quantization = config.get("quantization") or {}
        ranks = [prepare_weights(tensors, quantization, compute_dtype) for tensors in ranks]
        return cls(config, ranks, compute_dtype, str(ckpt_dir))

    def pack_products(self) -> None:
        """Keep a packed copy of every float32 weight a product multiplies (``products.py``: products of two rows or
        more multiply it), made when the model loads so that every product of the model multiplies the same way.
        Each such weight is then held twice. Nothing is packed where oneDNN is missing; asking again packs nothing
        new."""
        for pp_rank in range(self.dims.pp_size):
            for tp_rank in range(self.dims.tp_size):
                weights = self.weights(pp_rank, tp_rank)
                halves = {f"transformer.layers.{i}.mlp.{m}.weight" for (p, r, i) in self.gate_up
                          if (p, r) == (pp_rank, tp_rank) for m in ("fc", "gate")}  # multiplied as gate_up
                for name in [n for n in weights if n.endswith(PRODUCT_WEIGHTS) and n not in halves]:
                    if f"{name}{PACKED}" not in weights and can_pack(weights[name]):
                        weights[f"{name}{PACKED}"] = pack(weights[name])
        for key, fused in self.gate_up.items():
            if key not in self.gate_up_packed and can_pack(fused):
                self.gate_up_packed[key] = pack(fused)

    def weights(self, pp_rank: int, tp_rank: int) -> Weights:
        """The tensors of one rank.

        Arguments:
            pp_rank: the pipeline stage; tp_rank: the tensor-parallel rank.
        """
        return self.ranks[self.mapping.rank(tp_rank, pp_rank)]

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
        return self.norm_fn(x, weight, self.dims.norm_epsilon)

    def qkv(self, layer: int, tp_rank: int, x: torch.Tensor, positions: torch.Tensor,
            seq_len: int, lora: LoraBatch | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One rank's queries and keys (rotated) and values, each [B, heads_r, T, d].

        Arguments:
            layer: global layer number; tp_rank: the rank; x: normalized hidden states [B, T, H];
            positions: [B, T] token positions; seq_len: tokens in the sequence (for dynamic rope scaling);
            lora: the adapters of the tokens (None: the base model).
        """
        pp_rank, local = self.layer_places[layer]
        out = self.rank_linear(layer, tp_rank, "attention.qkv", x, lora)
        d, hq, hkv = self.dims.head_size, self.dims.num_heads_per_rank, self.dims.num_kv_heads_per_rank
        qk, v = (t.unflatten(-1, (-1, d)).transpose(1, 2) for t in out.split([(hq + hkv) * d, hkv * d], -1))
        q, k = self.rope.rotate(qk, positions, seq_len).split([hq, hkv], dim=1)  # one rotation, per element
        k, v = kv_cache(self.weights(pp_rank, tp_rank), f"transformer.layers.{local}", self.kv_cache_quant_algo, k, v)
        return q, k, v

    def attention_output(self, layer: int, contexts: list[torch.Tensor], lora: LoraBatch | None = None) -> torch.Tensor:
        """``attention.dense`` of every rank's context [B, Hq_r, T, d], reduced across TP.

        Arguments:
            layer: global layer number; contexts: ``attend``'s output for each TP rank;
            lora: the adapters of the tokens (None: the base model).
        """
        pp_rank, local = self.layer_places[layer]
        partials = [self.rank_linear(layer, r, "attention.dense", c.transpose(1, 2).flatten(2), lora, with_bias=False)
                    for r, c in enumerate(contexts)]  # each rank's partial LoRA term is summed by the all-reduce
        return reduce(partials, self.weights(pp_rank, 0).get(f"transformer.layers.{local}.attention.dense.bias"))

    def mlp(self, layer: int, x: torch.Tensor, lora: LoraBatch | None = None) -> torch.Tensor:
        """The family's gated MLP on every rank, reduced across TP: ``proj(silu(fc(x)) * gate(x))`` (``silu``), or
        ``proj(x1 * silu(g))`` with ``[x1; g] = fc(x)`` split in halves on each rank (``swiglu``).

        Arguments:
            layer: global layer number; x: normalized hidden states [B, T, H];
            lora: the adapters of the tokens (None: the base model).
        """
        pp_rank, local = self.layer_places[layer]
        partials = []
        for r in range(self.dims.tp_size):
            if self.family.activation is Activation.SWIGLU:
                x1, gate = self.rank_linear(layer, r, "mlp.fc", x, lora).chunk(2, dim=-1)
                act = x1 * torch.nn.functional.silu(gate)
            elif (fused := self.gate_up.get((pp_rank, r, local))) is not None:  # one matmul for both
                fc, gate = product(x, fused, self.gate_up_packed.get((pp_rank, r, local))).chunk(2, dim=-1)
                if lora is not None:
                    fc, gate = (lora.add(layer, x, out, self.lora_parts[r][name])
                                for out, name in ((fc, "mlp.fc"), (gate, "mlp.gate")))
                act = torch.nn.functional.silu(fc) * gate
            else:
                act = torch.nn.functional.silu(self.rank_linear(layer, r, "mlp.fc", x, lora)) * \
                    self.rank_linear(layer, r, "mlp.gate", x, lora)
            partials.append(self.rank_linear(layer, r, "mlp.proj", act, lora, with_bias=False))
        return reduce(partials, self.weights(pp_rank, 0).get(f"transformer.layers.{local}.mlp.proj.bias"))

    def rank_linear(self, layer: int, tp_rank: int, name: str, x: torch.Tensor, lora: LoraBatch | None,
                    with_bias: bool = True) -> torch.Tensor:
        """One rank's part of a layer's linear (``attention.qkv``, ``mlp.fc``, ...) with its tokens' LoRA terms.

        Arguments:
            layer: global layer number; tp_rank: the rank; name: the linear; x: the rank's input [..., in];
            lora: the adapters of the tokens (None: the base model); with_bias: add the bias (row-parallel
            linears add theirs once, after the all-reduce).
        """
        pp_rank, local = self.layer_places[layer]
        out = linear(x, self.weights(pp_rank, tp_rank), f"transformer.layers.{local}.{name}", with_bias=with_bias)
        return out if lora is None else lora.add(layer, x, out, self.lora_parts[tp_rank][name])

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``ln_f`` and the gathered ``lm_head`` shards of the last stage, padding stripped, in float32.

        Arguments:
            hidden: the last layer's output [B, T, H].
        """
        last = self.dims.pp_size - 1
        x = self.norm_fn(hidden, self.weights(last, 0)["transformer.ln_f.weight"], self.dims.norm_epsilon)
        shards = [linear(x, self.weights(last, r), "lm_head") for r in range(self.dims.tp_size)]
        gathered = shards[0] if len(shards) == 1 else torch.cat(shards, dim=-1)  # one shard: no copy
        return gathered[..., : self.dims.vocab_size].float()

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, T, vocab_size] in float32 of whole sequences under a causal mask, or of token trees (several
        continuations of one prefix in one row, ``checkpoint/quality.option_tree``) under their own mask.

        Arguments:
            input_ids: [B, T] int64 token ids; positions: [B, T] each token's position (default: 0 to T-1);
            mask: boolean [T, T], True where a token sees another (default: causal).
        """
        batch, seq_len = input_ids.shape
        span = seq_len if positions is None else int(positions.max()) + 1  # the longest path's tokens
        positions = torch.arange(seq_len).expand(batch, seq_len) if positions is None else positions
        mask = causal_mask(seq_len, seq_len) if mask is None else mask
        hidden = self.embed(input_ids)
        for layer in range(self.dims.num_layers):
            x = self.norm(layer, "input_layernorm", hidden)
            contexts = [attend(*self.qkv(layer, r, x, positions, span), mask)
                        for r in range(self.dims.tp_size)]
            hidden = hidden + self.attention_output(layer, contexts)
            hidden = hidden + self.mlp(layer, self.norm(layer, "post_layernorm", hidden))
        return self.logits(hidden)
