"""The paged KV pool's bookkeeping: which blocks are free, who holds which, and full blocks found by hash.

A block holds the K/V of ``tokens_per_block`` consecutive tokens. With KV reuse on, every full, computed
block is registered under a hash of its tokens chained with its prefix's hash; a later sequence with the same
prefix takes the block instead of recomputing it (after comparing the tokens, so a hash collision is a miss).
Freed blocks keep their contents and hash until they are handed out again, oldest first.
A sequence that needs every prompt position's logits (prompt logprobs, context logits) takes no cached block.
Several sequences sampled for one request share the prompt's blocks: ``fork`` gives a new sequence the full
blocks of its group's first sequence (one more reference each) and a copy of its last, partial block, which each
sequence then writes on its own (copy-on-write, done at once since the next token writes it).
Asked to (``record_events``), it keeps the KV cache events of a router: a block registered under its hash
(``stored``, with its tokens and its prefix block's hash) and a hash dropped when its block is handed out again
(``removed``).
With reuse on it counts, for a prefix cache's hit rate, the tokens of every sequence it allocates
(``num_queried_tokens``, a resumed sequence's generated tokens included) and those found cached
(``num_hit_tokens``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from trtllm_kit.runtime.sequence import Sequence


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None
    prefix_hash: int | None = None
    token_ids: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class KvEvent:
    """A block's hash entering (``stored``) or leaving (``removed``) the reusable set; ``parent_hash`` is the
    previous block's (None for a sequence's first block)."""

    kind: str
    block_hash: int
    parent_hash: int | None = None
    token_ids: tuple[int, ...] = ()


class BlockManager:
    """Allocates blocks to sequences; ``can_*`` checks never change state, the paired actions do."""

    def __init__(self, num_blocks: int, tokens_per_block: int, enable_reuse: bool) -> None:
        """Arguments:
        num_blocks: blocks in the pool; tokens_per_block: tokens per block; enable_reuse: share full blocks.
        """
        self.tokens_per_block = tokens_per_block
        self.enable_reuse = enable_reuse
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_block_ids: dict[int, None] = dict.fromkeys(range(num_blocks))  # insertion order = LRU first
        self.hash_to_block_id: dict[int, int] = {}
        self.num_reused_blocks = 0
        self.num_missed_blocks = 0
        self.num_queried_tokens = 0
        self.num_hit_tokens = 0
        self.events: deque[KvEvent] | None = None  # KV cache events, kept only after ``record_events``

    def record_events(self, max_size: int) -> None:
        """Keep the KV cache events from now on, the newest ``max_size`` (the oldest dropped first).

        Arguments:
            max_size: how many events are kept until read.
        """
        self.events = deque(maxlen=max_size)

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.tokens_per_block)

    def prefix_hits(self, seq: Sequence) -> list[int]:
        """Ids of registered blocks equal to the sequence's leading full blocks; the last token is never a hit,
        so that its logits are computed."""
        hits: list[int] = []
        prefix_hash = seq.kv_salt
        reusable = self.enable_reuse and not seq.params.needs_prompt_logits and seq.kv_import is None
        for index in range((len(seq) - 1) // self.tokens_per_block if reusable else 0):
            token_ids = seq.block_token_ids(index, self.tokens_per_block)
            block_hash = hash((prefix_hash, tuple(token_ids)))
            block_id = self.hash_to_block_id.get(block_hash)
            if block_id is None:
                break
            block = self.blocks[block_id]
            if block.token_ids != token_ids or block.prefix_hash != prefix_hash:
                break
            hits.append(block_id)
            prefix_hash = block_hash
        return hits

    def can_allocate(self, seq: Sequence, num_tokens: int, extra_blocks: int = 0) -> bool:
        """Whether a sequence without blocks can get blocks for its first ``num_tokens`` tokens.

        Arguments:
            seq: a waiting sequence; num_tokens: tokens to cover (its next chunk, or its maximum length);
            extra_blocks: blocks that must stay free besides (for the forks of its group).
        """
        hits = self.prefix_hits(seq)
        hits_in_free = sum(block_id in self.free_block_ids for block_id in hits)
        new_blocks = max(self.blocks_needed(num_tokens) - len(hits), 0) + extra_blocks
        return new_blocks <= self.num_free_blocks - hits_in_free

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """Give a sequence its reused prefix blocks and fresh ones up to ``num_tokens`` tokens; the reused tokens
        (or those whose K/V it imports) count as computed.

        Arguments:
            seq: a waiting sequence without blocks; num_tokens: as for ``can_allocate``.
        """
        assert not seq.block_table and self.can_allocate(seq, num_tokens)
        hits = self.prefix_hits(seq)
        for block_id in hits:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_block_ids[block_id]
            block.ref_count += 1
            seq.block_table.append(block_id)
        self.num_reused_blocks += len(hits)
        if self.enable_reuse:
            self.num_missed_blocks += max((len(seq) - 1) // self.tokens_per_block - len(hits), 0)
            self.num_queried_tokens += len(seq)
            self.num_hit_tokens += len(hits) * self.tokens_per_block
        seq.num_cached_tokens = len(hits) * self.tokens_per_block
        seq.num_computed_tokens = max(seq.num_cached_tokens, seq.num_imported_tokens)
        self.append(seq, num_tokens)

    def can_append(self, seq: Sequence, num_tokens: int) -> bool:
        """Whether a sequence's table can grow to cover ``num_tokens`` tokens.

        Arguments:
            seq: a sequence holding blocks; num_tokens: the total it must cover after this step.
        """
        return self.blocks_needed(num_tokens) - len(seq.block_table) <= self.num_free_blocks

    def append(self, seq: Sequence, num_tokens: int) -> None:
        """Grow a sequence's table with fresh blocks (the oldest free ones) to cover ``num_tokens`` tokens.

        Arguments:
            seq: a sequence; num_tokens: as for ``can_append``.
        """
        assert self.can_append(seq, num_tokens)
        while len(seq.block_table) < self.blocks_needed(num_tokens):
            block_id = next(iter(self.free_block_ids))
            del self.free_block_ids[block_id]
            block = self.blocks[block_id]
            if block.hash is not None and self.hash_to_block_id.get(block.hash) == block_id:
                del self.hash_to_block_id[block.hash]
                if self.events is not None:
                    self.events.append(KvEvent("removed", block.hash))
            block.hash, block.prefix_hash, block.token_ids, block.ref_count = None, None, [], 1
            seq.block_table.append(block_id)

    def fork_blocks(self, seq: Sequence, num_tokens: int) -> int:
        """Fresh blocks a fork of ``seq`` (at its current length) takes to cover ``num_tokens`` tokens.

        Arguments:
            seq: the sequence forked from; num_tokens: the fork's reservation.
        """
        covered = max(num_tokens, len(seq))
        return self.blocks_needed(covered) - len(seq) // self.tokens_per_block

    def can_fork(self, seq: Sequence, num_tokens: int) -> bool:
        """Whether ``fork(seq, ..., num_tokens)`` finds its blocks.

        Arguments:
            seq: the sequence forked from; num_tokens: the fork's reservation.
        """
        return self.fork_blocks(seq, num_tokens) <= self.num_free_blocks

    def fork(self, parent: Sequence, child: Sequence, num_tokens: int) -> tuple[int, int] | None:
        """Give ``child`` (same tokens, no blocks) ``parent``'s full blocks and fresh ones up to ``num_tokens``;
        returns (parent's partial block, child's block) whose K/V the caller copies, or None when there is none.

        Arguments:
            parent: a sequence whose tokens are all computed; child: its fork; num_tokens: the child's reservation.
        """
        assert not child.block_table and self.can_fork(parent, num_tokens)
        num_shared = len(parent) // self.tokens_per_block
        for block_id in parent.block_table[:num_shared]:
            self.blocks[block_id].ref_count += 1
            child.block_table.append(block_id)
        self.num_reused_blocks += num_shared
        self.append(child, max(num_tokens, len(parent)))
        child.num_cached_tokens = num_shared * self.tokens_per_block
        if len(parent) % self.tokens_per_block == 0:
            return None
        return parent.block_table[num_shared], child.block_table[num_shared]

    def seal(self, seq: Sequence) -> None:
        """Register the sequence's full, computed blocks for reuse (called after each step).

        Arguments:
            seq: a sequence whose ``num_computed_tokens`` was just advanced.
        """
        if not self.enable_reuse:
            return
        prefix_hash = seq.kv_salt
        for index in range(min(seq.num_computed_tokens // self.tokens_per_block, len(seq.block_table))):
            block = self.blocks[seq.block_table[index]]
            if block.hash is None:
                block.token_ids = seq.block_token_ids(index, self.tokens_per_block)
                block.prefix_hash = prefix_hash
                block.hash = hash((prefix_hash, tuple(block.token_ids)))
                if block.hash not in self.hash_to_block_id:
                    self.hash_to_block_id[block.hash] = block.block_id
                    if self.events is not None:
                        self.events.append(KvEvent("stored", block.hash, prefix_hash if index else None,
                                                   tuple(block.token_ids)))
            prefix_hash = block.hash

    def free(self, seq: Sequence) -> None:
        """Return a sequence's blocks; unshared ones go to the free list, tail blocks first (evicted first).

        Arguments:
            seq: a finished, cancelled or preempted sequence.
        """
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0
            if block.ref_count == 0:
                self.free_block_ids[block_id] = None
        seq.block_table = []
        seq.num_computed_tokens = 0
