"""What a build asks of the plan: the engine's shape limits (None: derive from the plan), speculation's draft
memory, and their checks."""

from __future__ import annotations

from dataclasses import dataclass

from trtllm_kit.defaults import DEFAULT_KV_CACHE_FRACTION, DEFAULT_TOKENS_PER_BLOCK
from trtllm_kit.errors import KitUsageError


@dataclass(frozen=True)
class Limits:
    """The engine's shape limits; None means "derive from the plan"."""

    max_batch_size: int | None = None
    max_input_len: int | None = None
    max_seq_len: int | None = None
    max_num_tokens: int | None = None
    tokens_per_block: int = DEFAULT_TOKENS_PER_BLOCK
    kv_cache_fraction: float = DEFAULT_KV_CACHE_FRACTION
    context_logits: bool = False  # --gather_context_logits
    draft: DraftMemory | None = None  # speculative decoding: the verify step's tokens and the draft's memory


@dataclass(frozen=True)
class DraftMemory:
    """What speculation adds to each rank: K draft tokens verified per sequence and step (max_num_tokens grows by
    K per sequence in generation), and a draft model's weights and KV bytes per token (0 without a draft model)."""

    draft_len: int
    weight_bytes: int = 0
    kv_bytes_per_token: int = 0


def check_limits(limits: Limits) -> None:
    """Refuse a limit that is not a positive integer, a ``tokens_per_block`` that is not a power of two and a
    ``kv_cache_fraction`` outside (0, 1].

    Arguments:
        limits: what the user asked for.
    """
    for name in ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "tokens_per_block"):
        value = getattr(limits, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise KitUsageError(f"{name} must be a positive integer, got {value!r}.")
    if limits.tokens_per_block & (limits.tokens_per_block - 1):
        raise KitUsageError(f"tokens_per_block must be a power of two, got {limits.tokens_per_block}.")
    if not 0 < limits.kv_cache_fraction <= 1:
        raise KitUsageError(f"kv_cache_fraction must be in (0, 1], got {limits.kv_cache_fraction!r}.")
