"""The length of one sequence's output: ``max_tokens`` at most, and ``min_tokens`` before the end token may end it
(``end_id`` is masked until then; a stop word or ``max_tokens`` still ends it).

``Length`` holds these settings; the runtime's ``SamplingParams`` is one, so the minimum is named here and in the
wire's row (``trtllm_kit.wire.request``, whose rule the runtime checks it by) and nowhere else in the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TypeVar

from trtllm_kit.errors import KitUsageError

L = TypeVar("L", bound="Length")


@dataclass
class Length:
    """How many tokens one request generates: at most ``max_tokens``, and ``min_tokens`` before its end token."""

    max_tokens: int = 16
    min_tokens: int = 0

    def check_length(self) -> None:
        """Refuse a minimum above the maximum, naming both."""
        if self.min_tokens > self.max_tokens:
            raise KitUsageError(f"min_tokens must lie in [0, request_output_len={self.max_tokens}], "
                                f"got {self.min_tokens}.")

    def may_end(self, num_output_tokens: int) -> bool:
        """Whether the end token may end a sequence that has generated ``num_output_tokens``.

        Arguments:
            num_output_tokens: the tokens generated so far.
        """
        return num_output_tokens >= self.min_tokens

    def with_max_tokens(self: L, max_tokens: int) -> L:
        """These settings generating at most ``max_tokens`` tokens (the minimum lowered to them).

        Arguments:
            max_tokens: the new bound.
        """
        return replace(self, max_tokens=max_tokens, min_tokens=min(self.min_tokens, max_tokens))
