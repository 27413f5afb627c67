"""Speculative decoding's counters, per request and for the whole engine, under vLLM's meanings: drafts (steps
that proposed tokens), draft tokens proposed, draft tokens accepted, and accepted tokens per draft position."""

from __future__ import annotations

from dataclasses import dataclass, field

from trtllm_kit.wire import DraftAcceptance


@dataclass
class DraftCounts:
    """What speculation proposed and what the target kept; ``accepted_per_position[i]`` counts drafts whose token
    at position ``i`` (0-based) was accepted."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    def acceptance(self) -> DraftAcceptance | None:
        """A sequence's counts as its responses carry them (None: it never speculated)."""
        if not self.num_drafts:
            return None
        return DraftAcceptance(self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens)

    def record(self, num_draft_tokens: int, num_accepted: int) -> None:
        """Count one verified draft.

        Arguments:
            num_draft_tokens: tokens it proposed; num_accepted: its leading tokens the target accepted.
        """
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        missing = num_accepted - len(self.accepted_per_position)
        self.accepted_per_position += [0] * max(missing, 0)
        for position in range(num_accepted):
            self.accepted_per_position[position] += 1

    @property
    def acceptance_length(self) -> float:
        """Tokens emitted per verifying step: 1 + accepted / drafts (1.0 before any draft)."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0


SPEC_DECODE_COUNTERS: dict[str, str] = {  # vLLM's Prometheus counter → DraftCounts field
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
}
SPEC_DECODE_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"  # one counter per ``position`` label
ITERATION_KEYS = {"numRequestsWithDraftTokens": "num_drafts", "numDraftTokens": "num_draft_tokens",
                  "numAcceptedTokens": "num_accepted_tokens"}  # the executor's specDecodingStats key → field


def iteration_stats(now: DraftCounts, before: DraftCounts) -> dict[str, float]:
    """One iteration's ``specDecodingStats`` (the C++ executor's keys): what ``now`` gained over ``before``, and
    its acceptance length.

    Arguments:
        now: the engine's counts after the step; before: a copy of them before it.
    """
    gained = {key: getattr(now, field) - getattr(before, field) for key, field in ITERATION_KEYS.items()}
    drafts = gained["numRequestsWithDraftTokens"]
    return {**gained, "acceptanceLength": 1 + gained["numAcceptedTokens"] / drafts if drafts else 1.0}
