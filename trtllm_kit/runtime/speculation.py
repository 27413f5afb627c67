"""Speculative decoding inside in-flight batching: before the step's forward pass each sequence in generation takes
a draft of up to K tokens (``attach``), computed with its last token through the paged KV cache in the same pass;
``verify`` then emits the longest accepted prefix and one token more, one token at a time through the scheduler's
``postprocess`` (so end ids, stop words, the maximum and minimum lengths, penalties and grammars apply at each
position as without speculation), and the rejected positions' K/V are dropped: they lie past
``num_computed_tokens``, are never sealed for reuse and are overwritten by the next step.
"""

from __future__ import annotations

from typing import Protocol

import torch

from trtllm_kit.runtime.draft_acceptance import verify_token
from trtllm_kit.runtime.draft_counts import DraftCounts
from trtllm_kit.runtime.logprobs import record_generated
from trtllm_kit.runtime.sampling import sampling_error
from trtllm_kit.runtime.scheduler import Scheduler
from trtllm_kit.runtime.sequence import Sequence


class Proposer(Protocol):
    """Where drafts come from: prompt lookup or a draft model."""

    def propose(self, seqs: list[Sequence], max_draft_lens: list[int]) -> list[list[int]]: ...

    def forget(self, seq: Sequence) -> None: ...


class FirstDraft:
    """Each sequence's draft from the first proposer that has one (the request's own drafts before prompt lookup)."""

    def __init__(self, *proposers: Proposer) -> None:
        """Arguments:
        proposers: asked in order.
        """
        self.proposers = proposers

    def propose(self, seqs: list[Sequence], max_draft_lens: list[int]) -> list[list[int]]:
        """Each sequence's first non-empty draft.

        Arguments:
            seqs: sequences in generation; max_draft_lens: the longest draft each may take.
        """
        drafts: list[list[int]] = [[] for _ in seqs]
        for proposer in self.proposers:
            for i, draft in enumerate(proposer.propose(seqs, max_draft_lens)):
                drafts[i] = drafts[i] or draft
        return drafts

    def forget(self, seq: Sequence) -> None:
        """Tell every proposer.

        Arguments:
            seq: a finished sequence.
        """
        for proposer in self.proposers:
            proposer.forget(seq)


class AtMost:
    """A proposer asked for at most K tokens per sequence (a draft model decodes as many steps as the longest
    draft it is asked for, so a speculator whose K bounds a request's own drafts caps it here)."""

    def __init__(self, proposer: Proposer, max_draft_len: int) -> None:
        """Arguments:
        proposer: the bounded proposer; max_draft_len: K, the most tokens it is asked for.
        """
        self.proposer, self.max_draft_len = proposer, max_draft_len

    def propose(self, seqs: list[Sequence], max_draft_lens: list[int]) -> list[list[int]]:
        """The proposer's drafts, each at most K long.

        Arguments:
            seqs: sequences in generation; max_draft_lens: the longest draft each may take.
        """
        return self.proposer.propose(seqs, [min(limit, self.max_draft_len) for limit in max_draft_lens])

    def forget(self, seq: Sequence) -> None:
        """Tell the proposer.

        Arguments:
            seq: a finished sequence.
        """
        self.proposer.forget(seq)


class Speculator:
    """Owns the proposer, the draft length K and the engine-wide ``DraftCounts``."""

    def __init__(self, proposer: Proposer, max_draft_len: int) -> None:
        """Arguments:
        proposer: the draft source; max_draft_len: K, draft tokens per sequence and step.
        """
        self.proposer, self.max_draft_len = proposer, max_draft_len
        self.counts = DraftCounts()

    def attach(self, seqs: list[Sequence], scheduler: Scheduler) -> list[Sequence]:
        """Append a draft to each scheduled sequence in generation that has one, within the step's token budget,
        the sequence's ``max_tokens`` and the free KV blocks; returns those sequences.

        Arguments:
            seqs: the step's scheduled sequences; scheduler: their scheduler (its config and block manager).
        """
        config, manager = scheduler.config, scheduler.block_manager
        if config.batch_scheduler_policy == "static":
            return []
        budget = config.max_num_tokens - sum(seq.num_scheduled_tokens for seq in seqs)
        ready, limits = [], []
        for seq in seqs:
            is_generating = seq.num_output_tokens > 0 and seq.num_uncomputed_tokens == seq.num_scheduled_tokens == 1
            if seq.is_finished or not is_generating:
                continue
            limit = max(min(self.max_draft_len, seq.params.max_tokens - seq.num_output_tokens - 1, budget), 0)
            if limit:
                ready.append(seq)
                limits.append(limit)
                budget -= limit
        speculating = []
        for seq, limit, draft in zip(ready, limits, self.proposer.propose(ready, limits) if ready else [],
                                     strict=True):
            draft = draft[:limit]
            while draft and not manager.can_append(seq, len(seq) + len(draft)):
                draft.pop()
            if draft:
                manager.append(seq, len(seq) + len(draft))
                seq.token_ids += draft
                seq.num_scheduled_tokens += len(draft)
                speculating.append(seq)
        return speculating

    def verify(self, seqs: list[Sequence], logits: torch.Tensor, scheduler: Scheduler) -> list[Sequence]:
        """Emit each speculating sequence's accepted draft tokens and the target's next token; returns the
        sequences that finished.

        Arguments:
            seqs: ``attach``'s sequences; logits: [sum of their K + 1, vocab] the target's raw logits at each one's
            last token and draft positions, in order; scheduler: their scheduler.
        """
        finished: list[Sequence] = []
        offset = 0
        for seq in seqs:
            num_draft = seq.num_scheduled_tokens - 1
            draft = seq.token_ids[len(seq) - num_draft:]
            del seq.token_ids[len(seq) - num_draft:]
            rows, offset = logits[offset:offset + num_draft + 1], offset + num_draft + 1
            seq.num_scheduled_tokens = 0
            num_accepted = 0
            for position, row in enumerate(rows):
                token, accepted = verify_token(row, seq, draft[position] if position < num_draft else None)
                if token is None:
                    seq.error = sampling_error(seq)
                    scheduler.finish(seq, "error")
                    finished.append(seq)
                    break
                before = seq.num_output_tokens
                seq.num_scheduled_tokens = 1
                finished += scheduler.postprocess([seq], [token])
                record_generated(row[None], [seq], [seq.num_output_tokens > before])
                num_accepted += accepted
                if not accepted or seq.is_finished:
                    break
            seq.num_scheduled_tokens = 0
            self.counts.record(num_draft, num_accepted)
            seq.draft_counts.record(num_draft, num_accepted)
        return finished

    def forget(self, seqs: list[Sequence]) -> None:
        """Drop what the proposer holds for finished sequences (a draft model's sequences and blocks).

        Arguments:
            seqs: the step's finished sequences.
        """
        for seq in seqs:
            self.proposer.forget(seq)
