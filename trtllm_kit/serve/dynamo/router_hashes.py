"""Dynamo's KV router hashes of a token sequence's full blocks, computed on the worker.

The router keys a block by two hashes (Dynamo's ``kv-router`` protocols): the block's own, over its tokens
(``LocalBlockHash``: XXH3-64 of the token ids as little-endian u32, seed 1337), and the block's place in its
sequence (``SequenceHash``: the first block's own hash; then XXH3-64 of the parent's sequence hash and the block's
own hash as little-endian u64, seed 1337). Its index takes a worker's ``stored`` blocks under the worker's hashes
and keeps one hash per block of a shared prefix: a worker that names a prefix's blocks otherwise than the worker
that stored them first has its later blocks refused (``ParentBlockNotFound``). The kit's workers therefore name
every block by its sequence hash, the same on every worker and equal to what the router computes for a prompt.
"""

from __future__ import annotations

import struct

import xxhash

SEED = 1337  # Dynamo's XXH3 seed for block and sequence hashes


def block_hash(token_ids: list[int]) -> int:
    """The router's hash of one block's tokens (``LocalBlockHash``), unsigned 64-bit.

    Arguments:
        token_ids: the block's tokens, ``kv_block_size`` of them.
    """
    return xxhash.xxh3_64_intdigest(struct.pack(f"<{len(token_ids)}I", *token_ids), seed=SEED)


def sequence_hash(parent: int | None, token_ids: list[int]) -> int:
    """The router's hash of a block after the block hashed ``parent`` (``SequenceHash``), unsigned 64-bit.

    Arguments:
        parent: the previous block's sequence hash (None for a sequence's first block); token_ids: the block's tokens.
    """
    own = block_hash(token_ids)
    return own if parent is None else xxhash.xxh3_64_intdigest(struct.pack("<QQ", parent, own), seed=SEED)


def prompt_hashes(token_ids: list[int], block_size: int) -> list[int]:
    """The sequence hashes of the full blocks of ``token_ids``, first block first.

    Arguments:
        token_ids: a prompt; block_size: tokens per KV block.
    """
    hashes: list[int] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        hashes.append(sequence_hash(hashes[-1] if hashes else None, token_ids[start:start + block_size]))
    return hashes
