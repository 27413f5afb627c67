"""One request in the CPU runtime: its tokens, its sampling settings, its KV block table and its progress."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field, fields
from enum import Enum, auto
from typing import TYPE_CHECKING

import torch

from trtllm_kit.errors import KitUsageError
from trtllm_kit.runtime.draft_counts import DraftCounts
from trtllm_kit.runtime.length import Length
from trtllm_kit.runtime.penalties import Penalties
from trtllm_kit.runtime.truncation import Truncation
from trtllm_kit.wire import GenerationRequest
from trtllm_kit.wire.fields import Row, rows
from trtllm_kit.wire.request import DEFAULT_PRIORITY, is_greedy_temperature

if TYPE_CHECKING:
    from trtllm_kit.runtime.grammar import CompiledGuide
    from trtllm_kit.runtime.kv_transfer import KvBlocks
    from trtllm_kit.runtime.lora import Adapter

BASE_KV_SALT = -1  # the base model's block hash chain starts here; an adapter's starts at its task id (UINT64)

@dataclass(frozen=True)
class TokenLogprob:
    """One token's log-probability and the ``k`` most likely tokens at its position (descending)."""

    token_id: int
    logprob: float
    rank: int  # 1 = the most likely token; the position of ``token_id`` when the vocabulary is sorted
    top_ids: tuple[int, ...] = ()
    top_logprobs: tuple[float, ...] = ()


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


@dataclass
class SamplingParams(Length, Truncation, Penalties):
    """Per-request generation settings with TensorRT-LLM's meanings: the output's length (``Length``,
    ``runtime/length.py``) and truncation (``Truncation``, ``runtime/truncation.py``: both off is greedy), and vLLM's
    penalties and probability floor (``Penalties``, ``runtime/penalties.py``).

    A field the wire's generation request also declares takes the values its row's rule accepts (``wire_rows``).
    ``ignore_eos``: ``end_id`` does not end the sequence. ``n`` sequences are returned of ``best_of`` sampled (None:
    ``n``), sharing the prompt's KV blocks; with ``best_of > n`` the ``n`` with the highest cumulative logprob.
    ``logprobs`` (None: off) keeps each generated token's logprob and that many top alternatives,
    ``prompt_logprobs`` the same for the prompt tokens (``runtime/logprobs.py``); ``return_context_logits`` /
    ``return_generation_logits`` keep the raw logits. ``guide``: a compiled grammar the output must match
    (``runtime/grammar.py``). ``keep_end_token`` keeps the token that ends the sequence (``end_id``, or the stop
    token a grammar accepts) as its last output token, with its logprob: vLLM's and OpenAI's answer; by default it
    is left out, as TensorRT-LLM's executor leaves it out.
    """

    end_id: int | None = None
    temperature: float = 1.0
    seed: int = 0
    stop_words: list[list[int]] = field(default_factory=list)
    priority: float = DEFAULT_PRIORITY  # TensorRT-LLM's request priority: in [0, 1], higher runs first
    ignore_eos: bool = False
    n: int = 1
    best_of: int | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    return_context_logits: bool = False
    return_generation_logits: bool = False
    guide: CompiledGuide | None = None
    keep_end_token: bool = False
    draft_ids: tuple[int, ...] = ()  # tokens drafted after the prompt, verified by the step (external_drafts.py)

    def __post_init__(self) -> None:
        for row in wire_rows():  # NaN and out-of-range values are refused naming the field
            value = getattr(self, row.name)
            if value is not None and row.rule is not None:
                row.rule.checked(row.name, value)
        self.check_length()
        if self.best_of is not None and self.best_of < self.n:
            raise KitUsageError(f"best_of must be an integer >= n ({self.n}), got {self.best_of}.")
        if any(not words for words in self.stop_words):
            raise KitUsageError("stop_words_list holds an empty stop word; drop it or give its token ids.")

    @property
    def is_greedy(self) -> bool:
        return is_greedy_temperature(self.temperature) or self.keeps_one

    @property
    def num_sequences(self) -> int:
        """Sequences sampled for the request: ``best_of``, else ``n``."""
        return self.best_of or self.n

    @property
    def needs_prompt_logits(self) -> bool:
        """Whether every prompt position's logits are needed (so no prompt block may be taken from the cache)."""
        return self.prompt_logprobs is not None or self.return_context_logits


@functools.cache
def wire_rows() -> tuple[Row, ...]:
    """The wire's rows of the request fields ``SamplingParams`` holds under the same name (each with its rule)."""
    names = {f.name for f in fields(SamplingParams)}
    return tuple(row for row in rows(GenerationRequest) if row.name in names and row.rule is not None)


class Sequence:
    """A prompt and the tokens generated after it. ``num_computed_tokens`` of them have K/V in the cache.

    A request sampling several sequences is a ``group`` (index order; ``index`` is the position in it). Its first
    sequence computes the prompt; the others wait unqueued (``fork_of`` set) until then and are forked from it.
    """

    def __init__(self, seq_id: int, prompt_ids: list[int], params: SamplingParams,
                 arrival_time: float | None = None, index: int = 0, adapter: Adapter | None = None) -> None:
        """Arguments:
        seq_id: unique id; prompt_ids: the input token ids; params: sampling settings;
        arrival_time: ``time.perf_counter()`` at arrival (now if None); index: the position in its group;
        adapter: the LoRA adapter it runs with (None: the base model).
        """
        if not prompt_ids:
            raise KitUsageError(f"request {seq_id} has no input_ids; send at least one token.")
        self.seq_id = seq_id
        self.token_ids = list(prompt_ids)
        self.num_prompt_tokens = len(prompt_ids)
        self.params = params
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # computed tokens found in reused blocks at the last admission
        self.num_scheduled_tokens = 0  # tokens to compute in the current step
        self.num_preemptions = 0
        self.finish_reason: str | None = None
        self.error: str | None = None  # why the engine could not run it (finish reason ``error``)
        self.arrival_time = time.perf_counter() if arrival_time is None else arrival_time
        self.first_token_time: float | None = None
        # Each sequence of a group draws its own numbers, reproducibly from the request's seed.
        self.generator = torch.Generator().manual_seed((params.seed + index) % 2**64)
        self.index = index
        self.adapter = adapter
        self.group: list[Sequence] = [self]
        self.fork_of: Sequence | None = None  # the group's first sequence while this one waits to be forked
        self.cum_logprob = 0.0  # raw logprob summed over the generated tokens
        self.output_logprobs: list[TokenLogprob] = []  # per generated token, when ``params.logprobs`` is set
        self.prompt_logprobs: list[TokenLogprob | None] = [None]  # per prompt token; the first has none
        self.context_logits: list[torch.Tensor] = []  # [vocab] per prompt position
        self.generation_logits: list[torch.Tensor] = []  # [vocab] per generated token
        self.matcher = params.guide.matcher() if params.guide is not None else None
        self.kv_import: KvBlocks | None = None  # its first tokens' K/V computed elsewhere, installed at admission
        self.holds_kv = False  # a context-only request: its blocks outlive it until the engine releases them
        self.draft_counts = DraftCounts()  # its speculation's drafts and accepted tokens

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def kv_salt(self) -> int:
        """What its K/V blocks' hashes start from: blocks computed under one adapter are never reused under another
        (``BASE_KV_SALT``: the base model). An int, whose hash every process computes alike, so that two workers
        name one prefix's blocks alike in the events they publish (``hash(None)`` differs between processes)."""
        return self.adapter.task_id if self.adapter is not None else BASE_KV_SALT

    @property
    def num_imported_tokens(self) -> int:
        """Tokens whose K/V arrive with the sequence (a generation-only request) and are not computed here."""
        return self.kv_import.num_tokens if self.kv_import is not None else 0

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def max_num_tokens(self) -> int:
        """Prompt plus every token the request may generate: the length a KV reservation must cover."""
        return self.num_prompt_tokens + self.params.max_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def block_token_ids(self, index: int, tokens_per_block: int) -> list[int]:
        """The token ids held by block ``index`` of the table.

        Arguments:
            index: position in the block table; tokens_per_block: the pool's block size.
        """
        return self.token_ids[index * tokens_per_block:(index + 1) * tokens_per_block]

    def append_token(self, token_id: int) -> None:
        """Record a sampled token and finish the sequence if it ends it.

        Arguments:
            token_id: the sampled token; one that ends the sequence (``end_id``, or the stop token a complete
            grammar took) is kept in the output only with ``params.keep_end_token``.
        """
        if self.first_token_time is None:
            self.first_token_time = time.perf_counter()
        grammar_done = self.matcher is not None and self.matcher.accept(token_id) and self.matcher.is_terminated
        if grammar_done or (token_id == self.params.end_id and not self.params.ignore_eos):
            if self.params.keep_end_token:
                self.token_ids.append(token_id)
            self.finish_reason = "end_id"
            return
        self.token_ids.append(token_id)
        output = self.token_ids[self.num_prompt_tokens:]
        if any(output[-len(words):] == words for words in self.params.stop_words):
            self.finish_reason = "stop_words"
        elif len(output) >= self.params.max_tokens:
            self.finish_reason = "length"


def returned_sequences(first: Sequence) -> list[Sequence]:
    """What a request returns: its ``n`` sequences in index order, or with ``best_of > n`` the ``n`` with the highest
    cumulative logprob, best first (as TensorRT-LLM's LLM API re-indexes them).

    Arguments:
        first: any sequence of the request (its group is read).
    """
    params = first.params
    if params.num_sequences == params.n:
        return list(first.group)
    return sorted(first.group, key=lambda seq: -seq.cum_logprob)[:params.n]
