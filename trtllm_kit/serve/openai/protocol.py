"""OpenAI's wire format: request validation, its sampling in TensorRT-LLM's terms, response bodies, errors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trtllm_kit.model_repo.tensors import NEVER_END_ID
from trtllm_kit.runtime.sampling_rules import extras_problem, is_greedy_temperature, sampling_problem
from trtllm_kit.serve.http.errors import HTTPError
from trtllm_kit.serve.openai.request_limits import MAX_N, MAX_PROMPTS, MAX_STOPS, stops_problem
from trtllm_kit.wire import GenerationRequest

DEFAULT_MAX_TOKENS = {"text_completion": 16, "chat.completion": 128}
PRIORITY_RANGE = 100  # OpenAI ``priority`` (vLLM's: lower first, default 0) spans -100..100
MAX_INT32 = 2**31 - 1
# The fields the frontend implements, per endpoint; ``user`` is accepted and not used (it only labels a request).
FIELDS = {"model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop", "stream",
          "stream_options", "n", "min_tokens", "ignore_eos", "user", "priority", "include_stop_str_in_output",
          "skip_special_tokens", "best_of", "top_k", "min_p", "repetition_penalty", "presence_penalty",
          "frequency_penalty"}
# vLLM's sampling extras that pass to the engine as they are (their ranges: ``runtime.sampling_rules``)
EXTRAS = {"top_k": int, "min_p": float, "repetition_penalty": float, "presence_penalty": float,
          "frequency_penalty": float}
FIELDS |= {"response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar"}  # ``guided.py``
ENDPOINT_FIELDS = {"text_completion": FIELDS | {"prompt", "logprobs", "echo"},
                   "chat.completion": FIELDS | {"messages", "logprobs", "top_logprobs"}}
# OpenAI fields the frontend does not implement: accepted only at the value that asks for nothing.
NOT_IMPLEMENTED = {
                   "logit_bias": (None, {}), "suffix": (None, ""), "tools": (None, []), "tool_choice": (None, "none"),
                   "functions": (None, []), "function_call": (None, "none"), "parallel_tool_calls": (None,),
                   "service_tier": (None, "auto", "default"),
                   "store": (None, False), "metadata": (None, {}), "modalities": (None, ["text"]),
                   "prediction": (None,), "audio": (None,), "reasoning_effort": (None,)}
STREAM_OPTIONS = ("include_usage", "continuous_usage_stats")


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
    min_tokens: int | None = None
    ignore_eos: bool = False
    continuous_usage: bool = False  # ``stream_options.continuous_usage_stats``: usage in every chunk
    priority: int | None = None  # vLLM's extra field: lower runs first
    n: int = 1  # choices per prompt
    include_stop: bool = False  # vLLM's ``include_stop_str_in_output``: the stop sequence ends the text
    extras: dict[str, float | int] | None = None  # the sampling extras the request sets (``EXTRAS``)
    skip_special_tokens: bool = True
    best_of: int | None = None  # sequences generated per prompt when more than ``n`` (the n best are returned)


def trtllm_priority(priority: int) -> float:
    """vLLM's integer priority (lower first, default 0) as TensorRT-LLM's float (higher first, default 0.5):
    -100 → 1.0, 0 → 0.5, 100 → 0.0, linearly.

    Arguments:
        priority: the request's ``priority`` field, in -100..100.
    """
    return 0.5 - priority / (2 * PRIORITY_RANGE)


def check_fields(body: dict[str, Any], kind: str) -> None:
    """Refuse a field the frontend does not implement (OpenAI's own answer to an unknown one is a 400 too).

    Arguments:
        body: the JSON request body.
        kind: ``text_completion`` or ``chat.completion``.
    """
    for name, value in body.items():
        if name in ENDPOINT_FIELDS[kind]:
            continue
        if name in NOT_IMPLEMENTED:
            if any(type(value) is type(default) and value == default for default in NOT_IMPLEMENTED[name]):
                continue
            raise HTTPError(f"{name} is not supported by this server (got {value!r:.60}); leave it out.",
                               param=name, code="unsupported_parameter")
        raise HTTPError(f"Unrecognized request argument supplied: {name}.", param=name,
                           code="unknown_parameter")


def parse_sampling(body: dict[str, Any], kind: str, max_seq_len: int | None = None) -> Sampling:
    """Validate OpenAI's generation fields, quoting the bad value.

    Arguments:
        body: the JSON request body.
        kind: ``text_completion`` or ``chat.completion`` (their ``max_tokens`` defaults differ).
        max_seq_len: prompt plus output tokens the model takes (``max_tokens`` is bounded by it when known).
    """
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    max_tokens = DEFAULT_MAX_TOKENS[kind] if max_tokens is None else max_tokens
    least = 0 if body.get("echo") is True else 1  # echo with max_tokens 0 scores the prompt alone
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < least:
        raise HTTPError(f"max_tokens must be a positive integer, got {max_tokens!r}.", param="max_tokens")
    limit = MAX_INT32 if max_seq_len is None else max_seq_len - 1
    if max_tokens > limit:
        reason = f"this model's max_seq_len is {max_seq_len} tokens" if max_seq_len else "the limit is 2**31 - 1"
        raise HTTPError(f"max_tokens must be at most {limit} ({reason}), got {max_tokens}.", param="max_tokens")
    temperature, top_p, seed = body.get("temperature"), body.get("top_p"), body.get("seed")
    for name, value in (("temperature", temperature), ("top_p", top_p)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise HTTPError(f"{name} must be a number, got {value!r:.60}.", param=name)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise HTTPError(f"seed must be an integer from 0 to 2**64 - 1, got {seed!r:.60}.", param="seed")
    wrong = sampling_problem(temperature, top_p, seed)
    if wrong is not None:
        raise HTTPError(wrong[1], param=wrong[0])
    stop = body.get("stop") or []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise HTTPError(f"stop must be a string or a list of up to {MAX_STOPS} strings, got {stop!r:.60}.",
                           param="stop")
    problem = stops_problem(stops)
    if problem is not None:
        raise HTTPError(problem, param="stop")
    min_tokens = body.get("min_tokens")
    if min_tokens is not None and (isinstance(min_tokens, bool) or not isinstance(min_tokens, int)
                                   or not 0 <= min_tokens <= max_tokens):
        raise HTTPError(f"min_tokens must be an integer from 0 to max_tokens ({max_tokens}), got {min_tokens!r}.",
                           param="min_tokens")
    ignore_eos, include_stop = _flag(body, "ignore_eos"), _flag(body, "include_stop_str_in_output")
    skip_special_tokens = _flag(body, "skip_special_tokens", True)
    extras = _extras(body)
    n = 1 if body.get("n") is None else body["n"]
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise HTTPError(f"n must be an integer from 1 to {MAX_N}, got {n!r:.60}.", param="n")
    best_of = body.get("best_of")
    if best_of is not None and (isinstance(best_of, bool) or not isinstance(best_of, int)
                                or not n <= best_of <= MAX_N):
        raise HTTPError(f"best_of must be an integer from n ({n}) to {MAX_N}, got {best_of!r:.60}.",
                           param="best_of")
    priority = body.get("priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)
                                 or not -PRIORITY_RANGE <= priority <= PRIORITY_RANGE):
        raise HTTPError(f"priority must be an integer from {-PRIORITY_RANGE} to {PRIORITY_RANGE} (lower runs "
                           f"first), got {priority!r}.", param="priority")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise HTTPError(f"stream must be true or false, got {stream!r}.", param="stream")
    options = _stream_options(body.get("stream_options"), bool(stream))
    if stream and best_of is not None and best_of > n:
        raise HTTPError(f"best_of ({best_of}) greater than n ({n}) cannot be streamed: the best are known only "
                           "once all are done; send stream false, or best_of equal to n.", param="best_of")
    return Sampling(max_tokens, None if temperature is None else float(temperature),
                    None if top_p is None else float(top_p), seed, stops, bool(stream),
                    bool(options.get("include_usage", False)), min_tokens, ignore_eos,
                    bool(options.get("continuous_usage_stats", False)), priority, n, include_stop, extras,
                    skip_special_tokens, best_of if best_of is not None and best_of > n else None)


def _extras(body: dict[str, Any]) -> dict[str, float | int]:
    """The sampling extras the request sets, in vLLM's terms (``top_k`` -1 is off, as 0 is)."""
    extras: dict[str, float | int] = {}
    for name, kind in EXTRAS.items():
        value = body.get(name)
        if value is None:
            continue
        wanted = int if kind is int else int | float
        if isinstance(value, bool) or not isinstance(value, wanted):
            raise HTTPError(f"{name} must be {'an integer' if kind is int else 'a number'}, got {value!r:.60}.",
                               param=name)
        extras[name] = 0 if name == "top_k" and value == -1 else kind(value)
    wrong = extras_problem(**extras)  # type: ignore[arg-type]
    if wrong is not None:
        raise HTTPError(wrong[1], param=wrong[0])
    return extras


def _flag(body: dict[str, Any], name: str, default: bool = False) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise HTTPError(f"{name} must be true or false, got {value!r:.60}.", param=name)
    return value


def _stream_options(options: Any, stream: bool) -> dict[str, bool]:
    if options is None:
        return {}
    if not isinstance(options, dict) or not all(k in STREAM_OPTIONS and isinstance(v, bool)
                                                for k, v in options.items()):
        raise HTTPError(f"stream_options must be an object of {' and '.join(STREAM_OPTIONS)} booleans, got "
                           f"{options!r:.60}.", param="stream_options")
    if not stream:
        raise HTTPError("stream_options is only allowed when stream is true.", param="stream_options")
    return options


def parse_prompts(body: dict[str, Any], vocab_size: int | None) -> list[str | tuple[int, ...]]:
    """A completion's prompts: text, or token ids (a list of integers), or a list of up to ``MAX_PROMPTS`` of
    either.

    Arguments:
        body: the JSON request body.
        vocab_size: ids must be below it (unchecked when None).
    """
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):  # a list of prompts
        if len(prompt) > MAX_PROMPTS:
            raise HTTPError(f"prompt is a list of {len(prompt)} prompts; at most {MAX_PROMPTS} are allowed per "
                               "request: split it.", param="prompt")
        return [_one_prompt(p, vocab_size) for p in prompt]
    return [_one_prompt(prompt, vocab_size)]


def _one_prompt(prompt: Any, vocab_size: int | None) -> str | tuple[int, ...]:
    if isinstance(prompt, str):
        if not prompt:
            raise HTTPError("prompt is empty; send at least one character.", param="prompt")
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        bad = [t for t in prompt if t < 0 or (vocab_size is not None and t >= vocab_size)]
        if bad:
            raise HTTPError(f"token ids must be in [0, {vocab_size}) (the tokenizer's vocabulary), got {bad[0]}.",
                               param="prompt")
        return tuple(prompt)
    raise HTTPError(f"prompt must be a string or a list of token ids (or a list of them), "
                       f"got {prompt!r:.60}.", param="prompt")


def generation_request(prompt: str | tuple[int, ...], sampling: Sampling, request_id: str,
                       eos_id: int | None = None, **scoring: int | None) -> GenerationRequest:
    """OpenAI's sampling in TensorRT-LLM's terms: temperature 0, or below ``MIN_TEMPERATURE`` (too small to divide
    logits by), is greedy (top_k 1); otherwise sample with
    ``top_p`` (default 1, the whole distribution), since TensorRT-LLM treats top_k = top_p = 0 as greedy.
    ``ignore_eos`` sends ``end_id = -1``, which no token equals; otherwise the end id is the model's default
    (``eos_id``, which token-id prompts send to ``tensorrt_llm`` themselves).

    Arguments:
        prompt: the prompt text or token ids.
        sampling: the validated request fields (temperature defaults to OpenAI's 1).
        request_id: the request's id.
        eos_id: the tokenizer's end-of-sequence id.
        scoring: ``logprobs`` and ``prompt_logprobs`` (alternatives per token; None: not scored).
    """
    temperature = 1.0 if sampling.temperature is None else sampling.temperature
    end_id = NEVER_END_ID if sampling.ignore_eos else eos_id
    common: dict[str, Any] = {"seed": sampling.seed, "min_tokens": sampling.min_tokens, "end_id": end_id,
                              "request_id": request_id, **scoring,
                              "priority": None if sampling.priority is None else trtllm_priority(sampling.priority)}
    extras: dict[str, Any] = dict(sampling.extras or {})
    if is_greedy_temperature(temperature):
        extras.pop("top_k", None)  # greedy is top_k 1, and min_p keeps the most likely token
        return GenerationRequest(prompt, max(1, sampling.max_tokens), top_k=1, **common, **extras)
    top_p = 1.0 if sampling.top_p is None else sampling.top_p
    return GenerationRequest(prompt, max(1, sampling.max_tokens), temperature=temperature, top_p=top_p, **common,
                             **extras)


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
