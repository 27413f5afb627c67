"""The batch-1 decode step with the fewest torch calls: one sequence's one new token through every layer of a plain
checkpoint (one TP rank, weights in the compute dtype, the fused gate/up MLP, no row-parallel bias, no quantized KV
cache), giving the general step's values bit for bit (``tests/runtime/test_single_decode.py``).

The same arithmetic in fewer calls:

* each layer's tensors are looked up once per model, not by name in every call, and multiplied by
  ``products.product``, as ``linear`` multiplies them (at one row: MKL's product, through ``F.linear``);
* the residual stream is freed of -0.0 once (the embedding plus 0.0). The general step adds each layer's one-rank
  partial as ``hidden + (partial + 0.0)`` (``reduce``); on a stream without -0.0 that is ``hidden + partial`` (the
  sum of two numbers is -0.0 only when both are), so the partials are added in place, and the stream stays free of
  -0.0 (``addmm_`` into the stream would round otherwise: with the weights in the product layout it accumulates the
  product into the stream);
* the pool's keys and values of every layer, and the new token's slot in each, are viewed once per step (unbound
  into one view per layer); the new key and value are copied into the slot's view.
"""

from __future__ import annotations

from collections import abc
from dataclasses import dataclass
from typing import NamedTuple

import torch

from trtllm_kit.runtime.attention_groups import gather
from trtllm_kit.runtime.layers import attend
from trtllm_kit.runtime.model import CheckpointModel
from trtllm_kit.runtime.products import PACKED, LinearWeight
from trtllm_kit.runtime.sequence import Sequence


class LayerWeights(NamedTuple):
    """One layer's tensors; each linear's weight with its packed copy where the model keeps one
    (``CheckpointModel.pack_products``)."""

    input_norm: torch.Tensor
    qkv: LinearWeight
    qkv_bias: torch.Tensor | None
    dense: LinearWeight
    post_norm: torch.Tensor
    gate_up: LinearWeight
    proj: LinearWeight


def plain_layers(model: CheckpointModel) -> list[LayerWeights] | None:
    """Every layer's tensors when the checkpoint is plain (see the module), else None.

    Arguments:
        model: a loaded checkpoint.
    """
    if model.dims.tp_size != 1 or model.kv_cache_quant_algo is not None:
        return None
    layers = []
    for pp_rank, local in model.layer_places:
        weights, prefix = model.weights(pp_rank, 0), f"transformer.layers.{local}"
        gate_up = model.gate_up.get((pp_rank, 0, local))
        qkv, dense, proj = (LinearWeight(weights[f"{prefix}.{name}.weight"],
                                         weights.get(f"{prefix}.{name}.weight{PACKED}"))
                            for name in ("attention.qkv", "attention.dense", "mlp.proj"))
        if gate_up is None or any(w.matrix.dtype != model.dtype for w in (qkv, dense, proj)) \
                or any(f"{prefix}.{name}.bias" in weights for name in ("attention.dense", "mlp.proj")):
            return None
        layers.append(LayerWeights(weights[f"{prefix}.input_layernorm.weight"], qkv,
                                   weights.get(f"{prefix}.attention.qkv.bias"), dense,
                                   weights[f"{prefix}.post_layernorm.weight"],
                                   LinearWeight(gate_up, model.gate_up_packed.get((pp_rank, 0, local))), proj))
    return layers


class SingleDecode:
    """The batch-1 decode step of one model over one K/V pool (``can_decode`` / ``decode``)."""

    def __init__(self, model: CheckpointModel, layers: list[LayerWeights], k_cache: torch.Tensor,
                 v_cache: torch.Tensor, tokens_per_block: int) -> None:
        """Arguments:
        model: a plain checkpoint; layers: its ``plain_layers``; k_cache, v_cache: the pool [layers, 1, slots,
        kv_heads, d]; tokens_per_block: slots per block.
        """
        self.model, self.layers, self.tokens_per_block = model, layers, tokens_per_block
        self.k_parts, self.v_parts = k_cache[:, 0], v_cache[:, 0]  # [layers, slots, kv_heads, d]

    @staticmethod
    def can_decode(seqs: list[Sequence], sampled: list[Sequence], drafted: list[Sequence]) -> bool:
        """Whether the step is one base-model sequence's one new token, sampled, with no prompt logits to keep.

        Arguments:
            seqs, sampled, drafted: the step's sequences, those sampled and those verifying a draft.
        """
        return len(seqs) == 1 and not drafted and sampled == seqs and is_plain_decode(seqs[0])

    def decode(self, seq: Sequence) -> torch.Tensor:
        """Compute ``seq``'s new token (writing its K/V into the pool); the logits [1, vocab_size] of its position.

        Arguments:
            seq: a sequence ``can_decode`` accepts.
        """
        model, dims = self.model, self.model.dims
        d, hq, hkv = dims.head_size, dims.num_heads_per_rank, dims.num_kv_heads_per_rank
        position = seq.num_computed_tokens
        seq_len, tpb = position + 1, self.tokens_per_block
        slot = seq.block_table[position // tpb] * tpb + position % tpb
        keys, values = self._step_keys(seq.block_table, seq_len)
        new_keys = self.k_parts[:, None, slot, :, None].unbind(0)  # each layer's slot [1, kv_heads, 1, d]
        new_values = self.v_parts[:, None, slot, :, None].unbind(0)
        positions = torch.tensor([[position]])
        hidden = model.embed(torch.tensor([seq.token_ids[position]])).add_(0.0)  # [1, H], no -0.0
        norm, eps = model.norm_fn, dims.norm_epsilon
        for layer, w in enumerate(self.layers):
            qkv = w.qkv.times(norm(hidden, w.input_norm, eps))
            if w.qkv_bias is not None:
                qkv = qkv + w.qkv_bias
            qk, v = qkv.view(1, hq + 2 * hkv, 1, d).split_with_sizes([hq + hkv, hkv], dim=1)
            q, k = model.rope.rotate(qk, positions, seq_len).split_with_sizes([hq, hkv], dim=1)  # one rotation
            new_keys[layer].copy_(k)
            new_values[layer].copy_(v)
            context = attend(q.view(1, hkv, hq // hkv, d), keys[layer], values[layer], None)
            add_product(hidden, context.view(1, hq * d), w.dense)
            fc, gate = w.gate_up.times(norm(hidden, w.post_norm, eps)).chunk(2, dim=-1)
            add_product(hidden, torch.nn.functional.silu(fc).mul_(gate), w.proj)
        return model.logits(hidden[None])[0]

    def _step_keys(self, block_table: list[int], seq_len: int) -> tuple[abc.Sequence[torch.Tensor] | Gathered,
                                                                        abc.Sequence[torch.Tensor] | Gathered]:
        """The keys and values [1, kv_heads, seq_len, d] of each layer, indexed by layer: views of every layer's pool
        taken once when the sequence's slots are consecutive, else each layer's gathered on its turn (after the
        layer wrote its new token)."""
        tpb = self.tokens_per_block
        num_blocks = -(-seq_len // tpb)
        first = block_table[0]
        if block_table[:num_blocks] == list(range(first, first + num_blocks)):
            span = slice(first * tpb, first * tpb + seq_len)
            return (self.k_parts[:, span].transpose(1, 2)[:, None].unbind(0),
                    self.v_parts[:, span].transpose(1, 2)[:, None].unbind(0))
        slots = (torch.tensor(block_table[:num_blocks])[:, None] * tpb + torch.arange(tpb)).flatten()[:seq_len]
        return Gathered(self.k_parts, slots), Gathered(self.v_parts, slots)


def is_plain_decode(seq: Sequence) -> bool:
    """Whether a scheduled sequence computes one new token with the base model and keeps no prompt logits.

    Arguments:
        seq: a sequence of the step.
    """
    return seq.num_scheduled_tokens == 1 and seq.adapter is None and \
        (not seq.params.needs_prompt_logits or seq.num_computed_tokens >= seq.num_prompt_tokens)


@dataclass(frozen=True)
class Gathered:
    """Each layer's keys (or values) [1, kv_heads, S, d] at ``slots``, gathered from its pool when indexed."""

    parts: torch.Tensor  # [layers, slots, kv_heads, d]
    slots: torch.Tensor  # [S]

    def __getitem__(self, layer: int) -> torch.Tensor:
        return gather(self.parts[layer], self.slots)[None].transpose(1, 2)


def add_product(hidden: torch.Tensor, x: torch.Tensor, weight: LinearWeight) -> None:
    """``hidden += x @ weight.matrix.T``, the product (``products.product``) rounded to the dtype first.

    Arguments:
        hidden: [rows, out], changed in place; x: [rows, in]; weight: the linear's weight [out, in] and packed copy.
    """
    hidden.add_(weight.times(x))
