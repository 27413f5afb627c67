"""OpenAI's wire format: request validation, its sampling in TensorRT-LLM's terms, response bodies, errors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trtllm_kit.serve.client import GenerationRequest

DEFAULT_MAX_TOKENS = {"text_completion": 16, "chat.completion": 128}


class RequestError(Exception):
    """A request the frontend refuses, as OpenAI's ``{"error": {...}}`` with an HTTP status."""

    def __init__(self, message: str, status: int = 400, *, param: str | None = None,
                 code: str | None = None, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}


@dataclass
class Sampling:
    """The validated generation fields of a completion or chat request."""

    max_tokens: int
    temperature: float | None
    top_p: float | None
    seed: int | None
    stops: list[str]
    stream: bool
    include_usage: bool


def parse_sampling(body: dict[str, Any], kind: str) -> Sampling:
    """Validate OpenAI's generation fields, quoting the bad value.

    Arguments:
        body: the JSON request body.
        kind: ``text_completion`` or ``chat.completion`` (their ``max_tokens`` defaults differ).
    """
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    max_tokens = DEFAULT_MAX_TOKENS[kind] if max_tokens is None else max_tokens
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise RequestError(f"max_tokens must be a positive integer, got {max_tokens!r}.", param="max_tokens")
    temperature, top_p, seed = body.get("temperature"), body.get("top_p"), body.get("seed")
    if temperature is not None and (not isinstance(temperature, int | float) or not 0 <= temperature <= 2):
        raise RequestError(f"temperature must be between 0 and 2, got {temperature!r}.", param="temperature")
    if top_p is not None and (not isinstance(top_p, int | float) or not 0 < top_p <= 1):
        raise RequestError(f"top_p must be in (0, 1], got {top_p!r}.", param="top_p")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise RequestError(f"seed must be a non-negative integer, got {seed!r}.", param="seed")
    stop = body.get("stop") or []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > 4 or not all(isinstance(s, str) for s in stops):
        raise RequestError(f"stop must be a string or a list of up to 4 strings, got {stop!r}.", param="stop")
    if body.get("n", 1) != 1:
        raise RequestError(f"n must be 1 here, got {body.get('n')!r}.", param="n")
    options = body.get("stream_options") or {}
    return Sampling(max_tokens, None if temperature is None else float(temperature),
                    None if top_p is None else float(top_p), seed, stops, bool(body.get("stream", False)),
                    bool(options.get("include_usage", False)))


def generation_request(prompt: str, sampling: Sampling, request_id: str) -> GenerationRequest:
    """OpenAI's sampling in TensorRT-LLM's terms: temperature 0 is greedy (top_k 1); otherwise sample with
    ``top_p`` (default 1, the whole distribution), since TensorRT-LLM treats top_k = top_p = 0 as greedy.

    Arguments:
        prompt: the prompt text.
        sampling: the validated request fields (temperature defaults to OpenAI's 1).
        request_id: the request's id.
    """
    temperature = 1.0 if sampling.temperature is None else sampling.temperature
    if temperature == 0:
        return GenerationRequest(prompt, sampling.max_tokens, top_k=1, seed=sampling.seed, request_id=request_id)
    top_p = 1.0 if sampling.top_p is None else sampling.top_p
    return GenerationRequest(prompt, sampling.max_tokens, temperature, top_p, seed=sampling.seed,
                             request_id=request_id)


@dataclass(frozen=True)
class ChoiceShape:
    """OpenAI's response bodies for one request: whole or streamed, completion or chat."""

    kind: str
    ident: str
    model: str
    created: int

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.ident, "object": obj, "created": self.created, "model": self.model}

    def whole(self, text: str, finish_reason: str, usage: dict[str, int]) -> dict[str, Any]:
        if self.kind == "text_completion":
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": finish_reason}
        return {**self._head(self.kind), "choices": [choice], "usage": usage}

    def chunk(self, piece: str | dict[str, str] | None, finish_reason: str | None) -> dict[str, Any]:
        if self.kind == "text_completion":
            choice = {"index": 0, "text": piece or "", "logprobs": None, "finish_reason": finish_reason}
            return {**self._head("text_completion"), "choices": [choice]}
        delta = piece if isinstance(piece, dict) else ({"content": piece} if piece is not None else {})
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {**self._head("chat.completion.chunk"), "choices": [choice]}
