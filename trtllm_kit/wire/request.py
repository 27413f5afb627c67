"""The generation request: one record from the OpenAI parse to the engine, each field declared once with what it
means when absent, its rule and its tensor in each dialect (``fields.py``).

``None`` means "not sent": the engine applies the row's default (``setting``), or for a few fields the model's own
(its end token, its ``exclude_input_in_output`` parameter). The record refuses a value out of its rule as it is
made, naming the field; a codec that reads a request from tensors names the tensor instead.

A temperature below ``MIN_TEMPERATURE`` is greedy. vLLM's and the LLM API's sampling fields mean what the wire's do
but for one thing: without ``top_p`` a temperature samples the whole vocabulary, where the wire's ``top_p`` 0 with
``top_k`` 0 is greedy (TensorRT-LLM's meaning); ``sampled_settings`` says theirs in the wire's terms, and
``greedy_settings`` says a greedy temperature as ``top_k`` 1, which every engine takes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from numbers import Integral
from typing import Any

from trtllm_kit.wire.disagg import DisaggHandle
from trtllm_kit.wire.fields import Migration, rows, wire
from trtllm_kit.wire.lora import LoraAdapter
from trtllm_kit.wire.rules import Rule, WireError, refusal

NEVER_END_ID = -1  # an ``end_id`` no token equals: generation stops only at ``max_tokens``
DEFAULT_PRIORITY = 0.5  # TensorRT-LLM's request priority, in [0, 1], higher first
MAX_LOGPROBS = 20  # top alternatives per token: OpenAI chat's ``top_logprobs`` bound and vLLM's ``max_logprobs``
GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar", "choice")
MAX_TOKEN_ID = 2**31 - 1  # token ids travel as INT32
MIN_TEMPERATURE = 1e-5  # a smaller temperature divides logits into infinities: greedy, as vLLM takes it
MIN_LENGTH = "min_tokens"  # the field of the minimum length: tokens generated before the end token may end them
FORCED_LENGTH = ("max_tokens", MIN_LENGTH)  # the fields that set a request's length exactly (``with_length``)
FLAG = Rule(bool)
PENALTY = Rule(float, -2, 2)
COUNTS_OUTPUT = Migration("refused", "which counts output tokens another worker sees as prompt; send it again")


def _flag(help: str, trtllm: str | None, llmapi: str | None, text: str | None, default: Any = False, *,
          openai: bool = False, trtllm_at: int | None = None, text_at: int | None = None) -> Any:
    return field(default=None, metadata=wire(help, default, FLAG, "BOOL", trtllm=trtllm, llmapi=llmapi, text=text,
                                             openai=openai, trtllm_at=trtllm_at, text_at=text_at))


def is_greedy_temperature(temperature: float) -> bool:
    """Whether ``temperature`` means greedy decoding (0, or too small to divide logits by).

    Arguments:
        temperature: a non-negative temperature.
    """
    return temperature < MIN_TEMPERATURE


def is_greedy(settings: Any) -> bool:
    """Whether settings by the wire's names decode greedily in vLLM's and the LLM API's terms: ``top_k`` 1, or a
    greedy temperature.

    Arguments:
        settings: an object with the wire's sampling fields as attributes (None: not set), such as the LLM API's
        ``SamplingParams``.
    """
    temperature = getattr(settings, "temperature", None)
    return getattr(settings, "top_k", None) == 1 or (temperature is not None and is_greedy_temperature(temperature))


def greedy_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` with a greedy temperature said as ``top_k`` 1, without the temperature or ``top_p`` (changed in
    place, and returned).

    Arguments:
        settings: sampling fields by the wire's names (the LLM API's ``SamplingParams`` names them the same).
    """
    temperature = settings.get("temperature")
    if temperature is not None and is_greedy_temperature(temperature):
        for name in ("temperature", "top_p"):
            settings.pop(name, None)
        settings["top_k"] = 1
    return settings


def sampled_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """vLLM's or the LLM API's sampling fields in the wire's terms: a greedy temperature as ``top_k`` 1, another
    with ``top_p`` 1 when it has none (changed in place, and returned).

    Arguments:
        settings: sampling fields by the wire's names (None: not set).
    """
    greedy_settings(settings)
    if settings.get("temperature") is not None and settings.get("top_p") is None:
        settings["top_p"] = 1.0
    return settings


def _token_ids(name: str, ids: tuple[Any, ...] | list[Any]) -> tuple[int, ...]:
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, Integral) or not 0 <= int(t) <= MAX_TOKEN_ID:
            raise refusal(name, "token ids from 0 to 2**31 - 1", t, "send ids of the model's vocabulary")
    return tuple(int(t) for t in ids)


@dataclass(frozen=True)
class GenerationRequest:
    """One generation: a prompt (text, or token ids) and how to continue it."""

    prompt: str | tuple[int, ...] = field(metadata=wire(
        "Text, or token ids (each in [0, 2**31 - 1]); never empty.",
        trtllm=("input_ids", "input_lengths"), llmapi=("text_input", "input_ids"), text=("text_input",)))
    max_tokens: int | None = field(default=16, metadata=wire(
        "Tokens to generate at most (None: the LLM API's default; tensorrt_llm requires it).", None, Rule(int, 1),
        "INT32", trtllm="request_output_len", llmapi="sampling_param_max_tokens", text="max_tokens", trtllm_at=2,
        text_at=1, openai=True))
    request_id: str = field(default="", metadata=wire("The Triton request id (no tensor; \"\": one is made)."))
    streaming: bool | None = _flag("One response per step.", "streaming", "streaming", "stream", trtllm_at=35,
                                   text_at=26)
    temperature: float | None = field(default=None, metadata=wire(
        "Softmax temperature; 0, or below 1e-5, is greedy.", 1.0, Rule(float, 0), "FP32",
        trtllm="temperature", llmapi="sampling_param_temperature", text="temperature", trtllm_at=13, text_at=10,
        openai=True))
    top_k: int | None = field(default=None, metadata=wire(
        "Sample among the k most likely tokens (0 = off).", 0, Rule(int, 0), "INT32",
        trtllm="runtime_top_k", llmapi="sampling_param_top_k", text="top_k", trtllm_at=14, text_at=8, openai=True,
        openai_off=-1))
    top_p: float | None = field(default=None, metadata=wire(
        "Nucleus sampling (tensorrt_llm: 0 with top_k 0 is greedy; the LLM API takes (0, 1]).", 0.0,
        Rule(float, 0, 1), "FP32", trtllm="runtime_top_p", llmapi="sampling_param_top_p", text="top_p", trtllm_at=15,
        text_at=9, openai=True, llmapi_rule=Rule(float, 0, 1, low_open=True)))
    min_p: float | None = field(default=None, metadata=wire(
        "vLLM's min_p: drop tokens below min_p times the top probability (0 = off).", 0.0, Rule(float, 0, 1),
        "FP32", trtllm="runtime_min_p", llmapi="sampling_param_min_p", strict=True, openai=True))
    seed: int | None = field(default=None, metadata=wire(
        "The random seed; sequence i of a request draws from seed + i.", 0, Rule(int, 0), "UINT64",
        trtllm="seed", llmapi="sampling_param_seed", text="seed", trtllm_at=26, text_at=16, openai=True,
        migration=Migration("refused", "whose random stream another worker cannot resume; send it again, or without "
                                       "a seed to let it migrate", sampled=True)))
    min_tokens: int | None = field(default=None, metadata=wire(
        "Tokens generated before the end token may end the sequence (at most max_tokens).", 0, Rule(int, 0),
        "INT32", trtllm="min_tokens", llmapi="sampling_param_min_tokens", text="min_tokens", trtllm_at=22,
        text_at=13, openai=True, migration=Migration("reduced")))
    end_id: int | None = field(default=None, metadata=wire(
        "The token that ends a sequence (None: the model's; -1: none, as the LLM API's ignore_eos).", None,
        Rule(int, NEVER_END_ID), "INT32", trtllm="end_id", llmapi="sampling_param_end_id", text="end_id",
        trtllm_at=7, text_at=6))
    priority: float | None = field(default=None, metadata=wire(
        "TensorRT-LLM's request priority, higher first.", DEFAULT_PRIORITY, Rule(float, 0, 1), "FP32",
        trtllm="priority", llmapi="priority", text="priority", text_at=29))
    repetition_penalty: float | None = field(default=None, metadata=wire(
        "Divides the logits of tokens already seen (1 = off).", 1.0, Rule(float, 0, low_open=True), "FP32",
        trtllm="repetition_penalty", llmapi="sampling_param_repetition_penalty", text="repetition_penalty",
        trtllm_at=21, text_at=12, strict=True, openai=True))
    presence_penalty: float | None = field(default=None, metadata=wire(
        "Subtracted once from the logits of tokens already seen.", 0.0, PENALTY, "FP32",
        trtllm="presence_penalty", llmapi="sampling_param_presence_penalty", text="presence_penalty", trtllm_at=24,
        text_at=14, strict=True, openai=True, migration=COUNTS_OUTPUT))
    frequency_penalty: float | None = field(default=None, metadata=wire(
        "Subtracted per occurrence from the logits of tokens already seen.", 0.0, PENALTY, "FP32",
        trtllm="frequency_penalty", llmapi="sampling_param_frequency_penalty", text="frequency_penalty",
        trtllm_at=25, text_at=15, strict=True, openai=True, migration=COUNTS_OUTPUT))
    n: int | None = field(default=None, metadata=wire(
        "Sequences returned, each response tagged with its sequence_index (None: one, untagged); tensorrt_llm's "
        "num_return_sequences carries best_of when it is larger.", 1, Rule(int, 1), "INT32",
        trtllm="num_return_sequences", llmapi="sampling_param_n", text="num_return_sequences", trtllm_at=3,
        text_at=25))
    best_of: int | None = field(default=None, metadata=wire(
        "Sequences generated when more than n: the n of highest cumulative logprob are returned.", None,
        Rule(int, 1), "INT32", llmapi="sampling_param_best_of", strict=True))
    beam_width: int | None = field(default=None, metadata=wire(
        "Beams (the CPU runtime runs 1).", 1, Rule(int, 1), "INT32", trtllm="beam_width", text="beam_width",
        trtllm_at=12, text_at=24, strict=True, beams=True))
    length_penalty: float | None = field(default=None, metadata=wire(
        "Beam search's length penalty (the CPU runtime runs 1.0).", 1.0, Rule(float), "FP32",
        trtllm="len_penalty", text="length_penalty", trtllm_at=19, text_at=11, strict=True, openai=True,
        beams=True))
    logprobs: int | None = field(default=None, metadata=wire(
        "Each generated token's logprob with this many alternatives (None: not scored).", None,
        Rule(int, 0, MAX_LOGPROBS), trtllm=("return_log_probs", "num_top_log_probs"),
        llmapi=("sampling_param_logprobs",), strict=True))
    prompt_logprobs: int | None = field(default=None, metadata=wire(
        "Each prompt token's logprob with this many alternatives (None: not scored; tensorrt_llm shares one "
        "num_top_log_probs between both).", None, Rule(int, 0, MAX_LOGPROBS),
        trtllm=("return_prompt_log_probs", "num_top_log_probs"), llmapi=("sampling_param_prompt_logprobs",),
        strict=True, migration=Migration("dropped")))
    stop_words: tuple[tuple[int, ...], ...] = field(default=(), metadata=wire(
        "Stop sequences as token ids (empty ones are not sent).", trtllm=("stop_words_list",)))
    stop_strings: tuple[str, ...] = field(default=(), metadata=wire(
        "Stop sequences as text (the LLM API's stop).", llmapi=("sampling_param_stop",), openai="stop"))
    include_stop_str_in_output: bool | None = _flag(
        "A matched stop string stays in the output.", None, "sampling_param_include_stop_str_in_output", None,
        openai=True)
    guide: tuple[str, str] | None = field(default=None, metadata=wire(
        "Structured output: (guide type, guide), the type one of GUIDE_TYPES.",
        trtllm=("guided_decoding_guide_type", "guided_decoding_guide"),
        llmapi=("guided_decoding_guide_type", "guided_decoding_guide"), strict=True,
        migration=Migration("refused", "whose grammar another worker would start again; send it again")))
    draft_ids: tuple[int, ...] = field(default=(), metadata=wire(
        "Tokens drafted after the prompt (draft-target speculation): the model verifies them in one step and emits "
        "the accepted ones and its own next token.", trtllm=("draft_input_ids",), strict=True))
    keep_end_token: bool | None = _flag(
        "The token that ends the sequence is the last output token, with its logprob.", "keep_end_token",
        "keep_end_token", None)
    exclude_input_in_output: bool | None = _flag(
        "Output ids leave the prompt out (None: the model's exclude_input_in_output parameter).",
        "exclude_input_in_output", "sampling_param_exclude_input_from_output", "exclude_input_in_output", None,
        trtllm_at=33, text_at=23)
    return_num_input_tokens: bool | None = _flag(
        "Responses carry num_input_tokens.", "return_num_input_tokens", None, "return_num_input_tokens",
        trtllm_at=31, text_at=21)
    return_num_output_tokens: bool | None = _flag(
        "Responses carry num_output_tokens.", "return_num_output_tokens", None, "return_num_output_tokens",
        trtllm_at=32, text_at=22)
    return_perf_metrics: bool | None = _flag(
        "Responses carry the timing and KV-block outputs.", "return_perf_metrics",
        "sampling_param_return_perf_metrics", "return_perf_metrics", trtllm_at=30, text_at=20)
    return_context_logits: bool | None = _flag(
        "The prompt's logits come back (the C++ backend's way to prompt logprobs).", "return_context_logits", None,
        "return_context_logits", trtllm_at=28, text_at=18)
    return_generation_logits: bool | None = _flag(
        "Each generated token's logits come back.", "return_generation_logits", None, "return_generation_logits",
        trtllm_at=29, text_at=19)
    return_finish_reason: bool | None = _flag(
        "Responses carry finish_reason.", None, "return_finish_reason", None)
    return_stop_reason: bool | None = _flag("Responses carry stop_reason.", None, "return_stop_reason", None)
    return_cumulative_logprob: bool | None = _flag(
        "Responses carry cumulative_logprob.", None, "return_cumulative_logprob", None)
    lora: LoraAdapter | None = field(default=None, metadata=wire(
        "The adapter the request runs with (None: the base model).",
        trtllm=("lora_task_id", "lora_weights", "lora_config"), llmapi=("lora_name",),
        text=("lora_task_id", "lora_weights", "lora_config"), strict=True))
    disaggregated: DisaggHandle | None = field(default=None, metadata=wire(
        "A context-only or generation-only request's handle.", llmapi=("disaggregated_params",), strict=True))

    def __post_init__(self) -> None:
        cls: type = type(self)
        for declared in rows(cls):
            value, rule = getattr(self, declared.name), declared.rule
            if value is not None and rule is not None:
                object.__setattr__(self, declared.name, rule.checked(declared.name, value))
        self._check_prompt()
        if not isinstance(self.request_id, str):
            raise refusal("request_id", "a string", self.request_id)
        if self.min_tokens is not None and self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise refusal("min_tokens", f"an integer from 0 to max_tokens ({self.max_tokens})", self.min_tokens)
        if self.best_of is not None and self.best_of < (self.n or 1):
            raise refusal("best_of", f"an integer >= n ({self.n or 1})", self.best_of)
        words = self.stop_words
        if not isinstance(words, tuple | list) or not all(isinstance(w, tuple | list) for w in words):
            raise refusal("stop_words", "a list of token-id lists", words)
        object.__setattr__(self, "stop_words", tuple(_token_ids("stop_words", w) for w in words))
        strings = self.stop_strings
        if not isinstance(strings, tuple | list) or not all(isinstance(s, str) for s in strings):
            raise refusal("stop_strings", "a list of strings", strings)
        object.__setattr__(self, "stop_strings", tuple(strings))
        if not isinstance(self.draft_ids, tuple | list):
            raise refusal("draft_ids", "a list of token ids", self.draft_ids)
        object.__setattr__(self, "draft_ids", _token_ids("draft_ids", self.draft_ids))
        self._check_guide()
        for name, kind in (("lora", LoraAdapter), ("disaggregated", DisaggHandle)):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), kind):
                raise refusal(name, f"a {kind.__name__}", getattr(self, name))

    def _check_prompt(self) -> None:
        prompt = self.prompt
        if isinstance(prompt, str):
            if not prompt:
                raise WireError("prompt", "prompt is empty; send at least one character or token id.")
            return
        if not isinstance(prompt, tuple | list):
            raise refusal("prompt", "text or a list of token ids", prompt)
        if not prompt:
            raise WireError("prompt", "prompt holds no token ids; send at least one.")
        object.__setattr__(self, "prompt", _token_ids("prompt", prompt))

    def _check_guide(self) -> None:
        guide = self.guide
        if guide is None:
            return
        if not isinstance(guide, tuple | list) or len(guide) != 2 or not all(isinstance(g, str) for g in guide):
            raise refusal("guide", "a (guide type, guide) pair of strings", guide)
        if guide[0] not in GUIDE_TYPES:
            raise refusal("guided_decoding_guide_type", f"one of {', '.join(GUIDE_TYPES)}", guide[0],
                          "send one of them, or no guide")
        object.__setattr__(self, "guide", (guide[0], guide[1]))

    @property
    def num_sequences(self) -> int:
        """Sequences the engine generates: ``best_of``, else ``n``, else one."""
        return max(self.n or 1, self.best_of or 1)

    def with_max_tokens(self, max_tokens: int) -> GenerationRequest:
        """This request generating at most ``max_tokens`` tokens (``min_tokens`` lowered to them).

        Arguments:
            max_tokens: the new bound.
        """
        least = None if self.min_tokens is None else min(self.min_tokens, max_tokens)
        return replace(self, max_tokens=max_tokens, min_tokens=least)

    def with_length(self, num_tokens: int) -> GenerationRequest:
        """This request generating exactly ``num_tokens`` tokens unless a stop ends it (with ``end_id``
        ``NEVER_END_ID``: exactly that many), as a benchmark forces its output length.

        Arguments:
            num_tokens: the output length.
        """
        lengths: dict[str, Any] = dict.fromkeys(FORCED_LENGTH, num_tokens)
        return replace(self, **lengths)

    def setting(self, name: str) -> Any:
        """A field's value as the engine runs it: the value sent, else the row's default.

        Arguments:
            name: a declared field.
        """
        value = getattr(self, name)
        if value is not None:
            return value
        cls: type = type(self)
        return next(r.wire.default for r in rows(cls) if r.name == name)


# beam search's fields other than its width: they weigh beams, and mean nothing where one sequence is decoded
BEAM_WEIGHTS = tuple(row.name for row in rows(GenerationRequest) if row.wire.beams and row.name != "beam_width")
