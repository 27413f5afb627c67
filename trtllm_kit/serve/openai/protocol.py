"""OpenAI's response bodies, whole or streamed, completion or chat."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ChoiceShape:
    """OpenAI's response bodies for one request: whole or streamed, completion or chat."""

    kind: str
    ident: str
    model: str
    created: int

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.ident, "object": obj, "created": self.created, "model": self.model}

    def choice(self, index: int, text: str, finish_reason: str,
               logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        """One whole choice."""
        if self.kind == "text_completion":
            return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
        return {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
                "finish_reason": finish_reason}

    def whole(self, choices: list[dict[str, Any]], usage: dict[str, int]) -> dict[str, Any]:
        return {**self._head(self.kind), "choices": choices, "usage": usage}

    def chunk(self, piece: str | dict[str, str] | None, finish_reason: str | None,
              token_ids: tuple[int, ...] | None = None, logprobs: dict[str, Any] | None = None,
              index: int = 0) -> dict[str, Any]:
        """One streamed event of choice ``index``; ``token_ids`` (the ids this chunk carries) is sent when known."""
        extra = {} if token_ids is None else {"token_ids": list(token_ids)}
        if self.kind == "text_completion":
            choice = {"index": index, "text": piece or "", "logprobs": logprobs, "finish_reason": finish_reason,
                      **extra}
            return {**self._head("text_completion"), "choices": [choice]}
        delta = piece if isinstance(piece, dict) else ({"content": piece} if piece is not None else {})
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason, **extra}
        return {**self._head("chat.completion.chunk"), "choices": [choice]}
