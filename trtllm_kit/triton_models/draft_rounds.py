"""Draft-target speculation as ``tensorrt_llm_bls`` runs it, in rounds over two ``tensorrt_llm`` models (upstream's
``spec_decode`` layout); pure, the two models given as callables, so it is tested without Triton.

Each round the draft model continues the tokens so far by ``num_draft_tokens`` (fewer near ``max_tokens``; its
minimum length the same, so its end id does not cut the draft short), and the target model is sent the same tokens
with the draft as ``draft_input_ids`` and ``request_output_len`` one more than the draft: it answers the draft
tokens it accepted and one token of its own. The rounds end at ``max_tokens``, when the target answers no token or
its end id (it ended: an end left out of the output after accepted tokens shows as an empty next round), or at a
stop word, which the loop also finds across rounds (the target sees each round's tokens only as its prompt). The
request's minimum length goes to the target, less what is generated. The figures are upstream's acceptance outputs,
summed over the rounds (upstream's BLS returns its last round's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from trtllm_kit.errors import KitUsageError
from trtllm_kit.wire.request import MIN_LENGTH
from trtllm_kit.wire.scalars import field_row
from trtllm_kit.wire.trtllm import words_of

DRAFT_MODEL_PARAMETER = "tensorrt_llm_draft_model_name"  # the BLS parameter naming the draft's model
NUM_DRAFT_TOKENS = "num_draft_tokens"  # the BLS's per-request input turning speculation on (0 or absent: off)
USE_DRAFT_LOGITS = "use_draft_logits"
(MIN_LENGTH_INPUT,) = field_row(MIN_LENGTH).tensors("trtllm")  # the tensorrt_llm input of the minimum length
# what the loop sets on each call to either model (the rest are the request's tensorrt_llm inputs)
PER_CALL = ("input_ids", "input_lengths", "request_output_len", MIN_LENGTH_INPUT, "streaming",
            "exclude_input_in_output", "draft_input_ids")
# the request's inputs the draft is not sent: the target alone stops at a stop word and runs the request's adapter
NOT_DRAFTED = ("stop_words_list", "lora_task_id", "lora_weights", "lora_config", "return_perf_metrics")
# flags whose outputs would be per round, not per request: refused with speculation
REFUSED_FLAGS = ("return_log_probs", "return_context_logits", "return_generation_logits")


@dataclass(frozen=True)
class TargetCall:
    """What the target model is sent in a round (its other inputs are the request's)."""

    token_ids: list[int]  # the prompt and the tokens generated so far
    draft_ids: list[int]  # draft_input_ids
    max_tokens: int  # request_output_len: the draft's length plus one
    min_length: int  # the request's minimum length less the tokens generated (``MIN_LENGTH_INPUT``)


@dataclass(frozen=True)
class Round:
    """One round's new tokens and how many of its draft tokens the target kept."""

    token_ids: list[int]
    num_draft_tokens: int
    num_accepted: int


@dataclass
class Acceptance:
    """Upstream's acceptance outputs (``total_draft_tokens``, ``total_accepted_draft_tokens``,
    ``acceptance_rate``), summed over a request's rounds."""

    total_draft_tokens: int = 0
    total_accepted_draft_tokens: int = 0

    @property
    def acceptance_rate(self) -> float:
        """Accepted over drafted tokens (0 before any draft)."""
        return self.total_accepted_draft_tokens / self.total_draft_tokens if self.total_draft_tokens else 0.0

    def record(self, done: Round) -> None:
        """Add a round's figures.

        Arguments:
            done: the round.
        """
        self.total_draft_tokens += done.num_draft_tokens
        self.total_accepted_draft_tokens += done.num_accepted


Draft = Callable[[list[int], int], list[int]]  # (tokens so far, draft length) → the draft's tokens
Target = Callable[[TargetCall], list[int]]  # → the target's new tokens
# (model name, its inputs) → the generated ids of a non-streamed call and its generation logits, if returned
Call = Callable[[str, dict[str, np.ndarray]], tuple[list[int], np.ndarray | None]]


@dataclass
class DraftTargetLoop:
    """The rounds of one request.

    Arguments:
        prompt_ids: the prompt; max_tokens: tokens to generate at most; num_draft_tokens: draft tokens per round;
        draft, target: the two models; min_length: the request's minimum length; end_id: the token that ends a
        sequence (None: the model's, known only by the target answering short); stop_words: token-id stop words.
    """

    prompt_ids: list[int]
    max_tokens: int
    num_draft_tokens: int
    draft: Draft
    target: Target
    min_length: int = 0
    end_id: int | None = None
    stop_words: list[list[int]] = field(default_factory=list)
    acceptance: Acceptance = field(default_factory=Acceptance)

    def __post_init__(self) -> None:
        if self.num_draft_tokens < 1:
            raise KitUsageError(f"num_draft_tokens must be at least 1, got {self.num_draft_tokens}; send 0 or leave it "
                             "out to generate without speculation.")

    def rounds(self) -> Iterator[Round]:
        """Each round's new tokens, until the request ends; ``acceptance`` is up to date at each."""
        output: list[int] = []
        while len(output) < self.max_tokens:
            tokens = [*self.prompt_ids, *output]
            num_draft = min(self.num_draft_tokens, self.max_tokens - len(output) - 1)
            draft_ids = self.draft(tokens, num_draft)[:num_draft] if num_draft > 0 else []
            asked = len(draft_ids) + 1
            new = self.target(TargetCall(tokens, draft_ids, asked, min(max(self.min_length - len(output), 0), asked)))
            new, stopped = self._until_stop_word(output, new[:asked])
            done = Round(new, len(draft_ids), accepted_prefix(draft_ids, new))
            self.acceptance.record(done)
            output += new
            yield done
            if stopped or not new or (self.end_id is not None and self.end_id in new):
                return

    def _until_stop_word(self, output: list[int], new: list[int]) -> tuple[list[int], bool]:
        """``new`` up to the first stop word that ends in it (counting the tokens before), and whether one did."""
        for end in range(1, len(new) + 1):
            tail = [*output, *new[:end]]
            if any(tail[-len(word):] == word for word in self.stop_words if len(word) <= len(tail)):
                return new[:end], True
        return new, False


def accepted_prefix(draft_ids: list[int], token_ids: list[int]) -> int:
    """How many draft tokens the target kept: the common prefix of the draft and the round's tokens (the target's
    own token after the last accepted one differs from the draft's there, or lies past the draft).

    Arguments:
        draft_ids: the round's draft; token_ids: the target's tokens of the round.
    """
    kept = 0
    for drafted, token in zip(draft_ids, token_ids, strict=False):
        if drafted != token:
            break
        kept += 1
    return kept


def chunks(loop: DraftTargetLoop, is_streamed: bool) -> Iterator[list[int]]:
    """The tokens to answer: each round's when streamed, else all of them at the end.

    Arguments:
        loop: the request's loop; is_streamed: whether the request streams.
    """
    output: list[int] = []
    for done in loop.rounds():
        if is_streamed:
            yield done.token_ids
        output += done.token_ids
    if not is_streamed:
        yield output


def call_arrays(request: Mapping[str, np.ndarray], token_ids: list[int], max_tokens: int, min_length: int,
                draft_ids: list[int] | None = None) -> dict[str, np.ndarray]:
    """One call's ``tensorrt_llm`` inputs (batch of one, not streamed, the prompt left out of the output).

    Arguments:
        request: the request's ``tensorrt_llm`` inputs by name; token_ids: the prompt and the tokens so far;
        max_tokens: request_output_len; min_length: the minimum length (``MIN_LENGTH_INPUT``); draft_ids:
        draft_input_ids (None: a draft's call, which is sent no ``NOT_DRAFTED`` input).
    """
    left_out = PER_CALL if draft_ids is not None else (*PER_CALL, *NOT_DRAFTED)
    arrays = {name: value for name, value in request.items() if name not in left_out}
    arrays.update(input_ids=np.array([token_ids], np.int32), input_lengths=np.array([[len(token_ids)]], np.int32),
                  request_output_len=np.array([[max_tokens]], np.int32),
                  **{MIN_LENGTH_INPUT: np.array([[min_length]], np.int32)}, streaming=np.array([[False]]),
                  exclude_input_in_output=np.array([[True]]))
    if draft_ids:
        arrays["draft_input_ids"] = np.array([draft_ids], np.int32)
    return arrays


def refuse_flags(request: Mapping[str, np.ndarray]) -> None:
    """Refuse the flags whose outputs speculation cannot answer per request.

    Arguments:
        request: the request's ``tensorrt_llm`` inputs by name.
    """
    for name in REFUSED_FLAGS:
        if name in request and bool(np.asarray(request[name]).any()):
            raise KitUsageError(f"{name} is not answered with speculation (num_draft_tokens > 0); send "
                                f"num_draft_tokens 0 to get it, or leave {name} out.")


def acceptance_arrays(acceptance: Acceptance) -> dict[str, np.ndarray]:
    """Upstream's acceptance outputs of the BLS, batch of one.

    Arguments:
        acceptance: the request's figures so far.
    """
    return {"acceptance_rate": np.array([[acceptance.acceptance_rate]], np.float32),
            "total_accepted_draft_tokens": np.array([[acceptance.total_accepted_draft_tokens]], np.int32),
            "total_draft_tokens": np.array([[acceptance.total_draft_tokens]], np.int32)}


def request_loop(request: Mapping[str, np.ndarray], num_draft_tokens: int, call: Call, models: tuple[str, str],
                 use_draft_logits: bool = False) -> DraftTargetLoop:
    """The loop of a BLS request: its prompt, limits, end id and stop words read from its ``tensorrt_llm`` inputs,
    the draft and target calls made through ``call``; with ``use_draft_logits`` the draft's generation logits of
    the round go to the target as ``draft_logits``.

    Arguments:
        request: the request's ``tensorrt_llm`` inputs by name (after preprocessing); num_draft_tokens: per round;
        call: runs a model; models: the (draft, target) model names; use_draft_logits: the request's flag.
    """
    draft_model, target_model = models
    if not draft_model:
        raise KitUsageError(f"num_draft_tokens is {num_draft_tokens}, but this tensorrt_llm_bls names no draft model "
                            f"({DRAFT_MODEL_PARAMETER}); send num_draft_tokens 0, or rebuild the repository with "
                            "--speculative draft-target.")
    refuse_flags(request)
    held: dict[str, np.ndarray | None] = {}  # the draft's logits of the round

    def draft(token_ids: list[int], num_tokens: int) -> list[int]:
        inputs = call_arrays(request, token_ids, num_tokens, num_tokens)
        inputs["return_generation_logits"] = np.array([[use_draft_logits]])
        ids, held["logits"] = call(draft_model, inputs)
        return ids

    def target(sent: TargetCall) -> list[int]:
        inputs = call_arrays(request, sent.token_ids, sent.max_tokens, sent.min_length, sent.draft_ids)
        logits = held.get("logits")
        if use_draft_logits and sent.draft_ids and logits is not None:  # [1, 1, tokens, vocab]: the draft's
            inputs["draft_logits"] = logits.reshape(-1, logits.shape[-1])[-len(sent.draft_ids):][None]
        return call(target_model, inputs)[0]

    def first(name: str) -> int | None:
        return int(np.asarray(request[name]).reshape(-1)[0]) if name in request else None

    ids = np.asarray(request["input_ids"]).reshape(-1).tolist()
    stop_words = words_of(request["stop_words_list"]) if "stop_words_list" in request else ()
    return DraftTargetLoop(ids[: first("input_lengths") or len(ids)], first("request_output_len") or 0,
                           num_draft_tokens, draft, target, first(MIN_LENGTH_INPUT) or 0, first("end_id"),
                           [list(word) for word in stop_words])
