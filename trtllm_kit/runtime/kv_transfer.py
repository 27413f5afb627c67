"""A sequence's K/V moved between two engines (disaggregated prefill and decode), in the paged pool's layout.

The context engine reads the blocks of a held sequence (``read_blocks``): K and V as the pool stores them,
``[num_layers, tp_size, num_blocks * tokens_per_block, num_kv_heads_per_rank, head_size]``, of which the first
``num_tokens`` token slots are the prompt's. On the wire (``encode`` / ``decode``) they are one JSON header line and
the raw bytes of K then V. The generation engine writes them into the slots of its own block table
(``write_tokens``), converting the layout where the two engines differ in block size or tensor-parallel split of
the KV heads; the layer count, the total KV heads, the head size and the dtype must agree, as upstream requires
of a context and a generation instance.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch

from trtllm_kit.errors import KitUsageError

DTYPES = {str(dtype).removeprefix("torch."): dtype for dtype in (torch.float32, torch.float16, torch.bfloat16)}


@dataclass(frozen=True)
class KvBlocks:
    """The K/V of a sequence's first ``num_tokens`` tokens, block by block as the context engine's pool holds them.

    Arguments:
        num_tokens: valid token slots (from the first); tokens_per_block: the context pool's block size;
        k, v: ``[num_layers, tp_size, num_blocks * tokens_per_block, num_kv_heads_per_rank, head_size]``.
    """

    num_tokens: int
    tokens_per_block: int
    k: torch.Tensor
    v: torch.Tensor

    @property
    def num_blocks(self) -> int:
        return self.k.shape[2] // self.tokens_per_block

    def token_major(self, tensor: torch.Tensor) -> torch.Tensor:
        """``[num_layers, num_tokens, num_kv_heads, head_size]``: the valid tokens with every rank's heads."""
        layers, tp_size, _, heads, head_size = tensor.shape
        return tensor[:, :, :self.num_tokens].permute(0, 2, 1, 3, 4).reshape(
            layers, self.num_tokens, tp_size * heads, head_size)

    def encode(self) -> bytes:
        """The wire form: a JSON header line, then K's and V's raw bytes."""
        header = {"num_tokens": self.num_tokens, "tokens_per_block": self.tokens_per_block,
                  "dtype": str(self.k.dtype).removeprefix("torch."), "shape": list(self.k.shape)}
        return json.dumps(header).encode() + b"\n" + _raw(self.k) + _raw(self.v)


def _raw(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().view(torch.uint8).numpy().tobytes()


def decode_header(line: bytes) -> tuple[dict, int]:
    """The header of the wire form and the byte count of K (V has as many).

    Arguments:
        line: the first line, without its newline.
    """
    header = json.loads(line)
    if header.get("dtype") not in DTYPES or len(header.get("shape", [])) != 5:
        raise KitUsageError(f"the KV transfer header {line[:200]!r} names no known dtype and 5-d shape.")
    count = 1
    for size in header["shape"]:
        count *= int(size)
    return header, count * DTYPES[header["dtype"]].itemsize


def decode(header: dict, k_bytes: bytes, v_bytes: bytes) -> KvBlocks:
    """``KvBlocks`` from the wire form's header and bytes.

    Arguments:
        header: from ``decode_header``; k_bytes, v_bytes: K's and V's raw bytes.
    """
    dtype, shape = DTYPES[header["dtype"]], [int(s) for s in header["shape"]]

    def tensor(raw: bytes) -> torch.Tensor:
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape)

    return KvBlocks(int(header["num_tokens"]), int(header["tokens_per_block"]), tensor(k_bytes), tensor(v_bytes))


def token_slots(block_table: list[int], tokens_per_block: int, num_tokens: int) -> torch.Tensor:
    """The pool slots of a sequence's first ``num_tokens`` tokens.

    Arguments:
        block_table: its blocks; tokens_per_block: the pool's block size; num_tokens: how many tokens.
    """
    table = torch.tensor(block_table, dtype=torch.long)
    return (table[:, None] * tokens_per_block + torch.arange(tokens_per_block)).flatten()[:num_tokens]


def read_blocks(k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: list[int], tokens_per_block: int,
                num_tokens: int) -> KvBlocks:
    """A copy of the blocks holding a sequence's first ``num_tokens`` tokens.

    Arguments:
        k_cache, v_cache: the pool; block_table: the sequence's blocks; tokens_per_block: the pool's block size;
        num_tokens: its tokens with K/V.
    """
    num_blocks = -(-num_tokens // tokens_per_block)
    slots = token_slots(block_table[:num_blocks], tokens_per_block, num_blocks * tokens_per_block)
    return KvBlocks(num_tokens, tokens_per_block, k_cache[:, :, slots].clone(), v_cache[:, :, slots].clone())


def check_layout(k_cache: torch.Tensor, kv: KvBlocks) -> None:
    """Refuse K/V the receiving pool cannot hold: another layer count, total KV heads, head size or dtype.

    Arguments:
        k_cache: the receiving pool's K; kv: the transferred K/V.
    """
    layers, tp_size, _, heads, head_size = k_cache.shape
    sent_layers, sent_tp, _, sent_heads, sent_size = kv.k.shape
    if (sent_layers, sent_tp * sent_heads, sent_size, kv.k.dtype) != (layers, tp_size * heads, head_size,
                                                                       k_cache.dtype) or kv.v.shape != kv.k.shape:
        raise KitUsageError(f"the transferred KV cache has {sent_layers} layers, {sent_tp * sent_heads} KV heads of "
                            f"{sent_size} in {kv.k.dtype}, but this engine has {layers}, {tp_size * heads} of "
                            f"{head_size} in {k_cache.dtype}; serve the same checkpoint and dtype in both roles.")


def write_tokens(k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, kv: KvBlocks) -> None:
    """Install ``kv`` (``check_layout`` passed) into the pool slots of the receiving sequence's first tokens,
    re-split over its TP ranks.

    Arguments:
        k_cache, v_cache: the receiving pool; slots: ``token_slots`` of its block table for ``kv.num_tokens``;
        kv: the transferred K/V.
    """
    layers, tp_size, _, heads, head_size = k_cache.shape
    for cache, sent in ((k_cache, kv.k), (v_cache, kv.v)):
        tokens = kv.token_major(sent).reshape(layers, kv.num_tokens, tp_size, heads, head_size)
        cache[:, :, slots] = tokens.permute(0, 2, 1, 3, 4)
