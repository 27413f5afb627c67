"""A sequence's K/V moved between two engines (disaggregated prefill and decode), in the paged pool's layout.

The context engine reads the blocks of a held sequence (``read_blocks``): K and V as the pool stores them,
``[num_layers, tp_size, num_blocks * tokens_per_block, num_kv_heads_per_rank, head_size]``, of which the first
``num_tokens`` token slots are the prompt's. On the wire (``encode`` / ``decode``) they are one JSON header line and
the raw bytes of K then V; the receiver checks every header field against its own pool and the prompt
(``decode_header``) before it allocates anything. The generation engine writes them into the slots of its own
block table (``write_tokens``), converting the layout where the two engines differ in block size or
tensor-parallel split of the KV heads; the layer count, the total KV heads, the head size and the dtype must
agree, as upstream requires of a context and a generation instance.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch

from trtllm_kit.errors import KitUsageError

DTYPES = {str(dtype).removeprefix("torch."): dtype for dtype in (torch.float32, torch.float16, torch.bfloat16)}
HEADER_FIELDS = ("num_tokens", "tokens_per_block", "dtype", "shape")
MAX_HEADER_BYTES = 1024  # a header is about 120 bytes
MAX_TOKENS_PER_BLOCK = 4096  # a context engine's block size the receiver accepts


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


@dataclass(frozen=True)
class KvLayout:
    """What a pool holds per token slot: layers, KV heads over all ranks, head size and dtype.

    Arguments:
        num_layers, num_kv_heads, head_size: the model's; dtype: the pool's.
    """

    num_layers: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype

    @classmethod
    def of(cls, k_cache: torch.Tensor) -> KvLayout:
        """The layout of a pool's K (``[num_layers, tp_size, slots, num_kv_heads_per_rank, head_size]``)."""
        layers, tp_size, _, heads, head_size = k_cache.shape
        return cls(layers, tp_size * heads, head_size, k_cache.dtype)


def decode_header(line: bytes, layout: KvLayout, num_tokens: int) -> tuple[dict, int]:
    """The header of the wire form and the byte count of K (V has as many), every field checked against what the
    receiving pool holds and the prompt's ``num_tokens`` before anything is allocated.

    Arguments:
        line: the first line, without its newline; layout: the receiving pool's; num_tokens: the prompt's tokens.
    """
    if len(line) > MAX_HEADER_BYTES:
        raise KitUsageError(f"the KV transfer header has {len(line)} bytes, more than {MAX_HEADER_BYTES}; serve "
                            "the same kit version in both roles.")
    try:
        header = json.loads(line)
    except (ValueError, RecursionError):
        raise KitUsageError(f"the KV transfer header {line[:80]!r} is not JSON; serve the same kit version in both "
                            "roles.") from None
    if not isinstance(header, dict) or sorted(header) != sorted(HEADER_FIELDS):
        raise KitUsageError(f"the KV transfer header {line[:80]!r} does not hold exactly "
                            f"{', '.join(HEADER_FIELDS)}; serve the same kit version in both roles.")
    dtype_name, shape = str(layout.dtype).removeprefix("torch."), header["shape"]
    if header["dtype"] != dtype_name or dtype_name not in DTYPES:
        raise KitUsageError(f"the KV transfer header's dtype is {str(header['dtype'])[:40]!r}, this engine's "
                            f"{dtype_name!r}; serve the same checkpoint and dtype in both roles.")
    if not _is_count(header["num_tokens"]) or header["num_tokens"] != num_tokens:
        raise KitUsageError(f"the KV transfer header's num_tokens is {str(header['num_tokens'])[:40]}, but the prompt "
                            f"has {num_tokens} tokens; send the context request's prompt unchanged.")
    tokens_per_block = header["tokens_per_block"]
    if not _is_count(tokens_per_block) or tokens_per_block > MAX_TOKENS_PER_BLOCK:
        raise KitUsageError(f"the KV transfer header's tokens_per_block is {str(tokens_per_block)[:40]}, outside "
                            f"[1, {MAX_TOKENS_PER_BLOCK}]; serve a context engine with a supported block size.")
    slots = -(-num_tokens // tokens_per_block) * tokens_per_block
    if not isinstance(shape, list) or len(shape) != 5 or not all(map(_is_count, shape)) or \
            layout.num_kv_heads % shape[1] or \
            shape != [layout.num_layers, shape[1], slots, layout.num_kv_heads // shape[1], layout.head_size]:
        raise KitUsageError(f"the KV transfer header's shape is {str(shape)[:120]}, not [{layout.num_layers}, tp, "
                            f"{slots}, {layout.num_kv_heads} / tp, {layout.head_size}] for this engine and prompt; "
                            "serve the same checkpoint in both roles.")
    count = 1
    for size in shape:
        count *= size
    return header, count * layout.dtype.itemsize


def _is_count(value: object) -> bool:
    """Whether ``value`` is a positive JSON integer (not a bool, float or string)."""
    return type(value) is int and value > 0


def decode(header: dict, k_bytes: bytes | bytearray, v_bytes: bytes | bytearray) -> KvBlocks:
    """``KvBlocks`` from the wire form's header (checked by ``decode_header``) and bytes.

    Arguments:
        header: from ``decode_header``; k_bytes, v_bytes: K's and V's raw bytes (a ``bytearray`` is used in place).
    """
    dtype, shape = DTYPES[header["dtype"]], [int(s) for s in header["shape"]]

    def tensor(raw: bytes | bytearray) -> torch.Tensor:
        buffer = raw if isinstance(raw, bytearray) else bytearray(raw)
        return torch.frombuffer(buffer, dtype=torch.uint8).view(dtype).reshape(shape)

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
