"""One response of a generation, in any dialect: the tokens it adds and what comes with them (counts, the sequence
it continues, logprobs, logits, finish reasons, timing, a disaggregation handle). ``None`` or empty: the response
does not carry it.

A scored token is ``(token id, logprob, alternatives)``: its logprob (None for the first prompt token, which has
no context) and the best alternatives at its position as ``(token id, logprob)``, most likely first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from trtllm_kit.wire.disagg import DisaggHandle

Scored = tuple[int, float | None, tuple[tuple[int, float], ...]]


@dataclass(frozen=True)
class Perf:
    """The timing and KV-block outputs of ``return_perf_metrics`` (times in ns since the epoch)."""

    arrival_time_ns: int
    first_token_time_ns: int
    last_token_time_ns: int
    kv_cache_reused_blocks: int
    kv_cache_alloc_new_blocks: int
    kv_cache_alloc_total_blocks: int


@dataclass(frozen=True)
class DraftAcceptance:
    """What speculative decoding did for one sequence so far: verifying steps that carried a draft (``num_drafts``),
    the draft tokens they proposed and the draft tokens the target accepted."""

    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int

    @property
    def acceptance_length(self) -> float:
        """Tokens emitted per verifying step: 1 + accepted / drafts."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0


@dataclass(frozen=True, eq=False)
class GenerationResponse:
    """One response.

    Arguments:
        token_ids: the tokens it carries (streamed: the new ones); texts: ``text_output``, one per completion
        (llmapi, and the text interface); sequence_index: which of the request's sequences it continues (None:
        untagged); num_input_tokens, num_output_tokens: the counts the model reports; cum_logprobs: each
        completion's cumulative logprob so far; num_top: alternatives per position in ``scored`` (and in
        ``prompt_scored`` without ``num_prompt_top``); num_prompt_top: alternatives per prompt position where the
        dialect counts them apart (llmapi; None: ``num_top``); scored: the carried tokens' logprobs (None: not
        asked for); prompt_scored: the prompt's (None: not in this response); context_logits [P, V],
        generation_logits [T, V]: raw logits; finish_reasons, stop_reasons: per completion (llmapi); perf: timing
        and KV blocks; disaggregated: the handle a context-only request returned; draft_acceptance: the sequence's
        speculative decoding counts so far (None: it did not speculate).
    """

    token_ids: tuple[int, ...] = ()
    texts: tuple[str, ...] = ()
    sequence_index: int | None = None
    num_input_tokens: int | None = None
    num_output_tokens: int | None = None
    cum_logprobs: tuple[float, ...] = ()
    num_top: int = 0
    num_prompt_top: int | None = None
    scored: tuple[Scored, ...] | None = None
    prompt_scored: tuple[Scored, ...] | None = None
    context_logits: np.ndarray | None = None
    generation_logits: np.ndarray | None = None
    finish_reasons: tuple[str, ...] = ()
    stop_reasons: tuple[str, ...] = ()
    perf: Perf | None = None
    disaggregated: DisaggHandle | None = None
    draft_acceptance: DraftAcceptance | None = None

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, GenerationResponse):
            return NotImplemented
        names = [name for name in self.__dataclass_fields__ if not name.endswith("_logits")]
        return all(getattr(self, n) == getattr(other, n) for n in names) and all(
            (a is None and b is None) or (a is not None and b is not None and np.array_equal(a, b))
            for a, b in ((self.context_logits, other.context_logits),
                         (self.generation_logits, other.generation_logits)))

    __hash__ = None  # type: ignore[assignment]

    @property
    def text(self) -> str:
        """Every completion's text, joined (how a client of one completion reads it)."""
        return "".join(self.texts)

    @property
    def cum_logprob(self) -> float | None:
        """The first completion's cumulative logprob, when reported."""
        return self.cum_logprobs[0] if self.cum_logprobs else None
