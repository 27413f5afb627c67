"""One request in the CPU runtime: its tokens, its sampling settings, its KV block table and its progress."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum, auto

import torch

from trtllm_kit.errors import KitUsageError
from trtllm_kit.runtime.sampling_rules import MAX_SEED, is_greedy_temperature

DEFAULT_PRIORITY = 0.5  # TensorRT-LLM's default request priority


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


@dataclass
class SamplingParams:
    """Per-request generation settings with TensorRT-LLM's meanings (``top_k`` 0 and ``top_p`` 0 = greedy)."""

    max_tokens: int = 16
    min_tokens: int = 0
    end_id: int | None = None
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 0.0
    seed: int = 0
    stop_words: list[list[int]] = field(default_factory=list)
    priority: float = DEFAULT_PRIORITY  # TensorRT-LLM's request priority: in [0, 1], higher runs first

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise KitUsageError(f"request_output_len must be at least 1, got {self.max_tokens}.")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise KitUsageError(f"min_tokens must lie in [0, request_output_len={self.max_tokens}], "
                                f"got {self.min_tokens}.")
        if not self.temperature >= 0 or self.top_k < 0 or not 0 <= self.top_p <= 1:  # NaN fails too
            raise KitUsageError(f"temperature {self.temperature} and runtime_top_k {self.top_k} must be >= 0 and "
                                f"runtime_top_p {self.top_p} in [0, 1].")
        if not 0 <= self.seed <= MAX_SEED:
            raise KitUsageError(f"seed must be an integer from 0 to 2**64 - 1, got {self.seed}.")
        if not 0 <= self.priority <= 1:
            raise KitUsageError(f"priority must lie in [0, 1] (higher runs first), got {self.priority}.")
        if any(not words for words in self.stop_words):
            raise KitUsageError("stop_words_list holds an empty stop word; drop it or give its token ids.")

    @property
    def is_greedy(self) -> bool:
        return is_greedy_temperature(self.temperature) or self.top_k == 1 or (self.top_k == 0 and self.top_p == 0)


class Sequence:
    """A prompt and the tokens generated after it. ``num_computed_tokens`` of them have K/V in the cache."""

    def __init__(self, seq_id: int, prompt_ids: list[int], params: SamplingParams,
                 arrival_time: float | None = None) -> None:
        """Arguments:
        seq_id: unique id; prompt_ids: the input token ids; params: sampling settings;
        arrival_time: ``time.perf_counter()`` at arrival (now if None).
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
        self.generator = torch.Generator().manual_seed(params.seed)

    def __len__(self) -> int:
        return len(self.token_ids)

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
            token_id: the sampled token; an ``end_id`` is not kept in the output.
        """
        if self.first_token_time is None:
            self.first_token_time = time.perf_counter()
        if token_id == self.params.end_id:
            self.finish_reason = "end_id"
            return
        self.token_ids.append(token_id)
        output = self.token_ids[self.num_prompt_tokens:]
        if any(output[-len(words):] == words for words in self.params.stop_words):
            self.finish_reason = "stop_words"
        elif len(output) >= self.params.max_tokens:
            self.finish_reason = "length"
