"""Draft-target speculation: a second model with its own paged KV pool (its own ``Executor``) proposes K greedy
tokens per step for each speculating sequence. Each target sequence has a draft sequence; before proposing, the
draft sequence takes the target's tokens and keeps the K/V of the prefix both still share (the rest, its rejected
proposals, is recomputed), then the draft engine decodes greedily, its sequences batched in flight. The draft pool
never reuses blocks by hash: a draft sequence rewrites positions it computed before.
"""

from __future__ import annotations

from trtllm_kit.errors import KitUsageError
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.executor import Executor
from trtllm_kit.runtime.model import CheckpointModel
from trtllm_kit.runtime.sequence import SamplingParams, Sequence


def draft_config(target: EngineConfig, max_draft_len: int) -> EngineConfig:
    """The draft engine's settings: the target's batch, step and pool sizes with room for K more tokens per
    sequence, evicting under pressure, chunked, without block reuse.

    Arguments:
        target: the target engine's settings; max_draft_len: K.
    """
    extra = -(-(max_draft_len + 1) // target.tokens_per_block) * target.tokens_per_block
    return EngineConfig(max_batch_size=target.max_batch_size, max_num_tokens=target.max_num_tokens,
                        tokens_per_block=target.tokens_per_block,
                        max_tokens_in_paged_kv_cache=target.max_tokens_in_paged_kv_cache + extra,
                        batch_scheduler_policy="max_utilization", enable_kv_cache_reuse=False,
                        enable_chunked_context=True)


class DraftModel:
    """Owns the draft engine and each target sequence's draft sequence."""

    def __init__(self, model: CheckpointModel, config: EngineConfig, vocab_size: int) -> None:
        """Arguments:
        model: the draft checkpoint, loaded; config: the draft engine's settings (``draft_config``);
        vocab_size: the target's vocabulary (a draft token beyond it ends the draft).
        """
        self.engine = Executor(model, config)
        self.vocab_size = vocab_size
        self.draft_of: dict[int, Sequence] = {}  # target seq_id → its draft sequence

    def propose(self, seqs: list[Sequence], max_draft_lens: list[int]) -> list[list[int]]:
        """Each sequence's draft, at most its ``max_draft_lens`` entry long (shorter when the draft engine ran out
        of room).

        Arguments:
            seqs: target sequences in generation; max_draft_lens: the longest draft each may take.
        """
        drafts = [self._follow(seq) for seq in seqs]
        for _ in range(max(max_draft_lens, default=0)):
            self.engine.step()
        proposals = []
        for seq, draft, limit in zip(seqs, drafts, max_draft_lens, strict=True):
            tokens = draft.token_ids[len(seq):len(seq) + limit] if draft is not None else []
            valid = next((i for i, t in enumerate(tokens) if t >= self.vocab_size), len(tokens))
            proposals.append(tokens[:valid])
        return proposals

    def forget(self, seq: Sequence) -> None:
        """Cancel the draft sequence of a finished target sequence (its blocks return to the draft pool).

        Arguments:
            seq: a finished target sequence.
        """
        draft = self.draft_of.pop(seq.seq_id, None)
        if draft is not None:
            self.engine.cancel(draft)

    def _follow(self, seq: Sequence) -> Sequence | None:
        """The draft sequence of ``seq`` holding its tokens, new or rewound to the prefix both share."""
        draft = self.draft_of.get(seq.seq_id)
        if draft is None or draft.is_finished:
            params = SamplingParams(max_tokens=seq.max_num_tokens - len(seq), ignore_eos=True)  # as long as seq
            try:
                draft = self.engine.add_request(list(seq.token_ids), params)
            except KitUsageError:  # the draft pool cannot hold it: this sequence goes without drafts
                return None
            self.draft_of[seq.seq_id] = draft
            return draft
        shared = next((i for i, (a, b) in enumerate(zip(draft.token_ids, seq.token_ids, strict=False))
                       if a != b),
                      min(len(draft), len(seq)))
        draft.token_ids = list(seq.token_ids)
        draft.num_computed_tokens = min(draft.num_computed_tokens, shared, len(seq) - 1)
        return draft
