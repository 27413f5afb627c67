"""The decode step of several sequences with fewer torch calls: each sequence's one new token through every layer of a
plain checkpoint (as ``runtime/single_decode.py`` says: one TP rank, weights in the compute dtype, the fused gate/up
MLP, no row-parallel bias, no quantized KV cache), giving the general step's values bit for bit
(``tests/runtime/test_batch_decode.py``).

The same arithmetic as the general step, in fewer calls:

* the tokens are the rows of one [B, H] stream; each layer's tensors are looked up once per model
  (``single_decode.plain_layers``) and multiplied by ``products.product``, as ``linear`` multiplies them (from two
  rows up, with the packed copies the model keeps);
* the stream is freed of -0.0 once, so each layer's one-rank partial is added in place (``single_decode.add_product``:
  the product, then the add; an ``addmm_`` into the stream rounds differently at some row counts);
* the attention is the general step's (``attention_groups``, ``attend_groups``): the same groups, masks and padded
  keys, so the same products.
"""

from __future__ import annotations

import torch

from trtllm_kit.runtime.attention_groups import attend_groups, attention_groups
from trtllm_kit.runtime.model import CheckpointModel
from trtllm_kit.runtime.sequence import Sequence
from trtllm_kit.runtime.single_decode import LayerWeights, add_product, is_plain_decode


class BatchDecode:
    """The decode step of several sequences of one model over one K/V pool (``can_decode`` / ``decode``)."""

    def __init__(self, model: CheckpointModel, layers: list[LayerWeights], k_cache: torch.Tensor,
                 v_cache: torch.Tensor, tokens_per_block: int) -> None:
        """Arguments:
        model: a plain checkpoint; layers: its ``plain_layers``; k_cache, v_cache: the pool [layers, 1, slots,
        kv_heads, d]; tokens_per_block: slots per block.
        """
        self.model, self.layers, self.tokens_per_block = model, layers, tokens_per_block
        self.k_parts, self.v_parts = k_cache[:, 0].unbind(0), v_cache[:, 0].unbind(0)  # each [slots, kv_heads, d]

    @staticmethod
    def can_decode(seqs: list[Sequence], sampled: list[Sequence], drafted: list[Sequence]) -> bool:
        """Whether the step is two or more base-model sequences' one new token each, all sampled, with no prompt
        logits to keep.

        Arguments:
            seqs, sampled, drafted: the step's sequences, those sampled and those verifying a draft.
        """
        return len(seqs) > 1 and not drafted and sampled == seqs and all(map(is_plain_decode, seqs))

    def decode(self, seqs: list[Sequence]) -> torch.Tensor:
        """Compute each sequence's new token (writing its K/V into the pool); the logits [len(seqs), vocab_size] of
        their positions, in order.

        Arguments:
            seqs: sequences ``can_decode`` accepts.
        """
        model, dims, tpb = self.model, self.model.dims, self.tokens_per_block
        d, hq, hkv = dims.head_size, dims.num_heads_per_rank, dims.num_kv_heads_per_rank
        num_seqs = len(seqs)
        starts = [s.num_computed_tokens for s in seqs]
        ends = [a + 1 for a in starts]
        slots = [(torch.tensor(s.block_table)[:, None] * tpb + torch.arange(tpb)).flatten()[:e]
                 for s, e in zip(seqs, ends, strict=True)]
        new_slots = torch.tensor([s.block_table[a // tpb] * tpb + a % tpb for s, a in zip(seqs, starts, strict=True)])
        groups = attention_groups(starts, [1] * num_seqs, list(range(num_seqs)), slots)
        masks = [None if g.mask is None else g.mask.repeat(1, 1, hq // hkv, 1) for g in groups]  # as the general step
        is_whole = len(groups) == 1 and groups[0].out_index.tolist() == list(range(num_seqs))
        positions, seq_len = torch.tensor(starts)[:, None], max(ends)  # [B, 1]: each row's one position
        hidden = model.embed(torch.tensor([s.token_ids[a] for s, a in zip(seqs, starts, strict=True)])).add_(0.0)
        norm, eps = model.norm_fn, dims.norm_epsilon
        for w, k_part, v_part in zip(self.layers, self.k_parts, self.v_parts, strict=True):
            qkv = w.qkv.times(norm(hidden, w.input_norm, eps))
            if w.qkv_bias is not None:
                qkv = qkv + w.qkv_bias
            qk, v = qkv.view(num_seqs, hq + 2 * hkv, 1, d).split_with_sizes([hq + hkv, hkv], dim=1)
            q, k = model.rope.rotate(qk, positions, seq_len).split_with_sizes([hq, hkv], dim=1)  # one rotation
            k_part[new_slots], v_part[new_slots] = k[:, :, 0], v[:, :, 0]
            context = attend_groups(q.transpose(0, 2), k_part, v_part, groups, masks, is_whole)  # [heads, B, d]
            add_product(hidden, context.transpose(0, 1).reshape(num_seqs, hq * d), w.dense)
            fc, gate = w.gate_up.times(norm(hidden, w.post_norm, eps)).chunk(2, dim=-1)
            add_product(hidden, torch.nn.functional.silu(fc).mul_(gate), w.proj)
        return model.logits(hidden[None])[0]
