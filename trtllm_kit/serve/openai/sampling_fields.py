"""What an OpenAI completion and chat request share, as one typed class (``OpenAIRequest``, pydantic; the two
requests are ``requests.py``'s): the fields, their parse and the generation they ask for.

The parse is strict (no coercion; a boolean is not a number) and keeps OpenAI's own bounds (temperature in [0, 2],
top_p in its wire row's ``llmapi_rule``, n ≤ ``MAX_N``, the stop and prompt bounds of ``request_limits``). vLLM's
sampling extras are the wire's rows that name an OpenAI field (``openai=`` in ``trtllm_kit.wire.request``) which
OpenAI's own fields here do not declare: the parse takes them from the rows (``SamplingExtras``), and each row's
rule checks its values.
``to_generation`` says the request in the wire's terms (the wire's ``sampled_settings``: a greedy temperature, and
a temperature without a nucleus bound, as the wire takes them); ``ignore_eos`` sends ``end_id`` -1.
"""

from __future__ import annotations

from collections.abc import Container
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    Strict,
    ValidationError,
    ValidationInfo,
    create_model,
    model_validator,
)
from pydantic_core import PydanticCustomError

from trtllm_kit.runtime.sampling_rules import MAX_SEED
from trtllm_kit.serve.http.errors import HTTPError
from trtllm_kit.serve.openai.guided import GUIDED_FIELDS, Guide, parse_guide, structured_field
from trtllm_kit.serve.openai.logprobs import Scoring
from trtllm_kit.serve.openai.refusals import FLAG, PRIORITY_RANGE, Sentences, field_refusal, refused
from trtllm_kit.serve.openai.request_limits import MAX_N, MAX_STOPS, stops_problem
from trtllm_kit.wire import GenerationRequest, WireError
from trtllm_kit.wire.fields import Row, rows
from trtllm_kit.wire.request import NEVER_END_ID, sampled_settings
from trtllm_kit.wire.rules import Rule
from trtllm_kit.wire.scalars import field_row

DEFAULT_MAX_TOKENS = {"text_completion": 16, "chat.completion": 128}
OPENAI_TEMPERATURE = 1.0  # OpenAI's temperature when the request has none
MAX_INT32 = 2**31 - 1
Int = Annotated[int, Strict()]
Prompt = str | tuple[int, ...]
R = TypeVar("R", bound="OpenAIRequest")
NULL_REFUSED = ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens", "echo")


def _nucleus() -> Rule:
    """OpenAI's bound of the nucleus: the LLM API's, (0, 1], which its wire row states (``llmapi_rule``)."""
    rule = field_row("top_p").wire.llmapi_rule
    assert rule is not None and rule.low_open, "the nucleus row states the LLM API's interval, open below"
    return rule


NUCLEUS = _nucleus()


def _by_wire_row(row: Row) -> BeforeValidator:
    """A sampling extra checked by its wire row (the row's ``openai_off``, vLLM's "off", is its default)."""
    name, rule, off = row.name, row.rule, row.wire.openai_off
    assert rule is not None, f"{name} has a rule on the wire"

    def check(value: Any) -> Any:
        if value is None:
            return None
        if off is not None and value == off and not isinstance(value, bool):
            value = row.wire.default
        try:
            return rule.checked(name, value)
        except WireError as exc:
            raise PydanticCustomError("wire", str(exc)) from None

    return BeforeValidator(check)


def trtllm_priority(priority: int) -> float:
    """vLLM's integer priority (lower first, default 0) as TensorRT-LLM's float (higher first, default 0.5):
    -100 → 1.0, 0 → 0.5, 100 → 0.0, linearly.

    Arguments:
        priority: the request's ``priority`` field, in -100..100.
    """
    return 0.5 - priority / (2 * PRIORITY_RANGE)

# OpenAI fields the frontend does not implement: accepted only at the value that asks for nothing.
NOT_IMPLEMENTED = {
                   "logit_bias": (None, {}), "suffix": (None, ""), "tools": (None, []), "tool_choice": (None, "none"),
                   "functions": (None, []), "function_call": (None, "none"), "parallel_tool_calls": (None,),
                   "service_tier": (None, "auto", "default"),
                   "store": (None, False), "metadata": (None, {}), "modalities": (None, ["text"]),
                   "prediction": (None,), "audio": (None,), "reasoning_effort": (None,)}


def check_fields(body: dict[str, Any], accepted: Container[str]) -> None:
    """Refuse a field the frontend does not implement (OpenAI's own answer to an unknown one is a 400 too).

    Arguments:
        body: the JSON request body.
        accepted: the fields the endpoint implements.
    """
    for name, value in body.items():
        if name in accepted:
            continue
        if name in NOT_IMPLEMENTED:
            if any(type(value) is type(default) and value == default for default in NOT_IMPLEMENTED[name]):
                continue
            raise HTTPError(f"{name} is not supported by this server (got {value!r:.60}); leave it out.",
                            param=name, code="unsupported_parameter")
        raise HTTPError(f"Unrecognized request argument supplied: {name}.", param=name,
                        code="unknown_parameter")


class StreamOptions(BaseModel):
    """``stream_options``: the usage chunk at the end, and the running usage in every chunk."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)
    include_usage: bool = False
    continuous_usage_stats: bool = False


class OpenAIFields(BaseModel):
    """OpenAI's own sampling fields, the first a completion and a chat request check."""

    model_config = ConfigDict(strict=True, extra="ignore")
    model: Any = None  # resolved by the handler before the parse
    user: Any = None  # labels the request (an alias picks its model by it)
    max_tokens: Int  # max_completion_tokens, else max_tokens, else the endpoint's default
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=NUCLEUS.low, le=NUCLEUS.high)
    seed: Int | None = Field(None, ge=0, le=MAX_SEED)
    stop: str | list[str] | None = None
    min_tokens: Int | None = Field(None, ge=0)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    sentences: ClassVar[Sentences] = {
        "max_tokens": ("{name} must be a positive integer, got {value!r}.", None),
        "temperature": ("{name} must be a number, got {value!r:.60}.",
                        "{name} must be between 0 and 2, got {value!r}."),
        "top_p": ("{name} must be a number, got {value!r:.60}.",
                  f"{{name}} must be in {NUCLEUS.interval}, got {{value!r}}."),
        "seed": ("{name} must be an integer from 0 to 2**64 - 1, got {value!r:.60}.", None),
        "stop": (f"{{name}} must be a string or a list of up to {MAX_STOPS} strings, got {{value!r:.60}}.", None),
        "min_tokens": ("{name} must be an integer from 0 to max_tokens ({max_tokens}), got {value!r}.", None),
        **dict.fromkeys(("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"), (FLAG, None))}


# the wire's rows an OpenAI body carries that OpenAI's own fields do not declare: vLLM's sampling extras
EXTRA_ROWS = tuple(row for row in rows(GenerationRequest)
                   if row.openai is not None and row.openai not in OpenAIFields.model_fields)
if TYPE_CHECKING:
    SamplingExtras = OpenAIFields
else:
    SamplingExtras = create_model(
        "SamplingExtras", __base__=OpenAIFields, __module__=__name__,
        **{str(row.openai): (Annotated[row.rule.kind | None, _by_wire_row(row)], None) for row in EXTRA_ROWS})


class OpenAIRequest(SamplingExtras):
    """The fields a completion and a chat request share, in the order they are checked: OpenAI's own, vLLM's
    sampling extras (``EXTRA_ROWS``), then the rest."""

    kind: ClassVar[str]
    n: Int = Field(1, ge=1, le=MAX_N)  # choices per prompt
    best_of: Int | None = None  # resolved: None unless more sequences than n are generated
    priority: Int | None = Field(None, ge=-PRIORITY_RANGE, le=PRIORITY_RANGE)
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: Any = None  # the structured-output fields: ``guided.py`` reads them
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    _guide: Guide | None = PrivateAttr(None)
    _guide_field: str | None = PrivateAttr(None)
    sentences: ClassVar[Sentences] = {
        **OpenAIFields.sentences, "n": (f"{{name}} must be an integer from 1 to {MAX_N}, got {{value!r:.60}}.", None),
        "best_of": (f"{{name}} must be an integer from n ({{n}}) to {MAX_N}, got {{value!r:.60}}.", None),
        "priority": (f"{{name}} must be an integer from {-PRIORITY_RANGE} to {PRIORITY_RANGE} (lower runs first), "
                     "got {value!r}.", None),
        "stream": ("{name} must be true or false, got {value!r}.", None),
        "stream_options": ("{name} must be an object of include_usage and continuous_usage_stats booleans, got "
                           "{value!r:.60}.", None)}

    @classmethod
    def parse(cls: type[R], body: dict[str, Any], *, max_seq_len: int | None = None,
              vocab_size: int | None = None) -> R:
        """The request of ``body``, or the 400 that names its first wrong field.

        Arguments:
            body: the JSON request body; max_seq_len: prompt plus output tokens the model takes (``max_tokens`` is
            bounded by it when known); vocab_size: token ids must be below it (unchecked when None).
        """
        check_fields(body, {*cls.model_fields, "max_completion_tokens"})
        given = {k: v for k, v in body.items() if v is not None or k in NULL_REFUSED}  # null: absent, but for flags
        given["max_tokens"] = given.pop("max_completion_tokens", given.get("max_tokens", DEFAULT_MAX_TOKENS[cls.kind]))
        try:
            return cls.model_validate(given, context={"max_seq_len": max_seq_len, "vocab_size": vocab_size})
        except ValidationError as exc:
            raise refused(exc, body, cls.sentences, given) from None

    @model_validator(mode="after")
    def _resolve(self, info: ValidationInfo) -> OpenAIRequest:
        max_seq_len = (info.context or {}).get("max_seq_len")
        max_tokens = self.max_tokens
        if max_tokens < (0 if self.scoring.echo else 1):  # echo with max_tokens 0 scores the prompt alone
            raise field_refusal(self.sentences, "max_tokens", max_tokens)
        limit = MAX_INT32 if max_seq_len is None else max_seq_len - 1
        if max_tokens > limit:
            reason = f"this model's max_seq_len is {max_seq_len} tokens" if max_seq_len else "the limit is 2**31 - 1"
            raise HTTPError(f"max_tokens must be at most {limit} ({reason}), got {max_tokens}.", param="max_tokens")
        problem = stops_problem(self.stops)
        if problem is not None:
            raise HTTPError(problem, param="stop")
        if self.min_tokens is not None and self.min_tokens > max_tokens:
            raise field_refusal(self.sentences, "min_tokens", self.min_tokens, max_tokens=max_tokens)
        if self.best_of is not None and not self.n <= self.best_of <= MAX_N:
            raise field_refusal(self.sentences, "best_of", self.best_of, n=self.n)
        if self.stream_options is not None and not self.stream:
            raise HTTPError("stream_options is only allowed when stream is true.", param="stream_options")
        if self.stream and self.best_of is not None and self.best_of > self.n:
            raise HTTPError(f"best_of ({self.best_of}) greater than n ({self.n}) cannot be streamed: the best are "
                            "known only once all are done; send stream false, or best_of equal to n.",
                            param="best_of")
        self.best_of = self.best_of if self.best_of is not None and self.best_of > self.n else None
        guided = {name: getattr(self, name) for name in GUIDED_FIELDS}
        self._guide, self._guide_field = parse_guide(guided), structured_field(guided)
        self._check_endpoint((info.context or {}).get("vocab_size"))
        return self

    def _check_endpoint(self, vocab_size: int | None) -> None:
        """The endpoint's own fields (the prompt, the messages, the logprob fields)."""

    @property
    def scoring(self) -> Scoring:
        """What the request asks to be scored."""
        return Scoring()

    @property
    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        """``stream_options.continuous_usage_stats``: the running usage in every chunk."""
        return self.stream_options is not None and self.stream_options.continuous_usage_stats

    @property
    def guide(self) -> Guide | None:
        """The structured-output guide (None: free text)."""
        return self._guide

    @property
    def guide_field(self) -> str | None:
        """The field that asked for structured output (None: none did)."""
        return self._guide_field

    @property
    def extras(self) -> dict[str, float | int]:
        """The sampling extras the request sets, in the wire's terms."""
        values = {row.name: getattr(self, str(row.openai)) for row in EXTRA_ROWS}
        return {name: value for name, value in values.items() if value is not None}

    def to_generation(self, prompt: Prompt, request_id: str, *, eos_id: int | None = None,
                      stop_words: tuple[tuple[int, ...], ...] = (), context_logits: bool | None = None,
                      seed: int | None = None, **fields: Any) -> GenerationRequest:
        """The generation of ``prompt`` as the wire carries it; a value the wire refuses is a 400 naming its field.

        Arguments:
            prompt: the prompt as sent (text, or token ids); request_id: the engine request's id; eos_id: the
            tokenizer's end id (token-id prompts send it); stop_words: the stop sequences as token ids;
            context_logits: whether the route's engine computes prompt logprobs from its context logits; seed: in
            place of the request's (a choice's own); fields: further wire fields (``n``, ``best_of``).
        """
        scoring = self.scoring
        prompt_logprobs = scoring.logprobs if scoring.echo else None
        priority = None if self.priority is None else trtllm_priority(self.priority)
        common: dict[str, Any] = {
            "seed": self.seed if seed is None else seed, "min_tokens": self.min_tokens, "request_id": request_id,
            "end_id": NEVER_END_ID if self.ignore_eos else eos_id, "priority": priority, "logprobs": scoring.logprobs,
            "prompt_logprobs": prompt_logprobs, "guide": self.guide, "stop_words": stop_words,
            "stop_strings": tuple(self.stops),
            "return_context_logits": True if context_logits and prompt_logprobs is not None else None,
            "keep_end_token": True if scoring.logprobs is not None else None, **self.extras, **fields}
        sampling = sampled_settings({**common, "temperature": OPENAI_TEMPERATURE if self.temperature is None
                                     else self.temperature, "top_p": self.top_p})
        try:
            return GenerationRequest(prompt, max(1, self.max_tokens), **sampling)
        except WireError as exc:
            raise HTTPError(str(exc), param=exc.field) from None

