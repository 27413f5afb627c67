"""OpenAI's responses: the bodies of a whole answer and of each streamed chunk (completion or chat), the
server-sent events that carry the chunks, and the headers that name the model that answered."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from trtllm_kit.serve.openai.routes import Alias, Route
from trtllm_kit.wire import DraftAcceptance

MODEL_HEADER, VERSION_HEADER, SPLIT_HEADER = "x-trtllm-kit-model", "x-trtllm-kit-model-version", "x-trtllm-kit-split"
DONE = b"data: [DONE]\n\n"  # the last event of a stream


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

    def whole(self, choices: list[dict[str, Any]], usage: dict[str, Any]) -> dict[str, Any]:
        return {**self._head(self.kind), "choices": choices, "usage": usage}

    def chunk(self, text: str | dict[str, str] | None, finish_reason: str | None,
              token_ids: tuple[int, ...] | None = None, logprobs: dict[str, Any] | None = None,
              index: int = 0) -> dict[str, Any]:
        """One streamed event of choice ``index``; ``token_ids`` (the ids this chunk carries) is sent when known."""
        extra = {} if token_ids is None else {"token_ids": list(token_ids)}
        if self.kind == "text_completion":
            choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason,
                      **extra}
            return {**self._head("text_completion"), "choices": [choice]}
        delta = text if isinstance(text, dict) else ({"content": text} if text is not None else {})
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason, **extra}
        return {**self._head("chat.completion.chunk"), "choices": [choice]}


def speculative_usage(acceptances: list[DraftAcceptance]) -> dict[str, Any] | None:
    """The ``usage`` extension of the choices that speculated: verifying steps with a draft (``drafts``), draft
    tokens proposed and accepted, and tokens per verifying step (``acceptance_length``); None when none did.

    Arguments:
        acceptances: each speculating choice's counts at its end.
    """
    if not acceptances:
        return None
    total = DraftAcceptance(sum(a.num_drafts for a in acceptances), sum(a.num_draft_tokens for a in acceptances),
                            sum(a.num_accepted_tokens for a in acceptances))
    return {"drafts": total.num_drafts, "draft_tokens": total.num_draft_tokens,
            "accepted_tokens": total.num_accepted_tokens, "acceptance_length": round(total.acceptance_length, 4)}


def route_headers(route: Route, alias: Alias | None) -> dict[str, str]:
    """The response headers that name the model, its version and the alias split that chose it."""
    headers = {MODEL_HEADER: route.name, VERSION_HEADER: str(route.version)}
    if alias is not None:
        headers[SPLIT_HEADER] = f"{alias.name}={alias.split}"
    return headers


def event_stream(headers: dict[str, str]) -> web.StreamResponse:
    """A response of server-sent events (prepared by the caller once it has something to send)."""
    return web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **headers})


async def send(response: web.StreamResponse, payload: dict[str, Any]) -> None:
    """One server-sent event of ``payload`` as JSON."""
    await response.write(f"data: {json.dumps(payload)}\n\n".encode())
