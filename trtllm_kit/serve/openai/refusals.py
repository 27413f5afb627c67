"""What the frontend says of a field the typed parse refused: one sentence per field, naming it and quoting the value
found, as OpenAI's 400 with ``param`` set. The parse's library says where and what kind of error (``loc``,
``type``); the sentence is the frontend's own, so a client reads the same text whichever check caught the value."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from trtllm_kit.serve.http.errors import HTTPError
from trtllm_kit.serve.openai.logprobs import MAX_COMPLETION_LOGPROBS, MAX_TOP_LOGPROBS
from trtllm_kit.serve.openai.request_limits import MAX_N, MAX_STOPS

PRIORITY_RANGE = 100  # OpenAI ``priority`` (vLLM's: lower first, default 0) spans -100..100
RANGE_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}
FLAG = "{name} must be true or false, got {value!r:.60}."
# field → (the sentence of a wrong type, the sentence of a value out of range; None: the same)
SENTENCES: dict[str, tuple[str, str | None]] = {
    "max_tokens": ("max_tokens must be a positive integer, got {value!r}.", None),
    "temperature": ("temperature must be a number, got {value!r:.60}.",
                    "temperature must be between 0 and 2, got {value!r}."),
    "top_p": ("top_p must be a number, got {value!r:.60}.", "top_p must be in (0, 1], got {value!r}."),
    "seed": ("seed must be an integer from 0 to 2**64 - 1, got {value!r:.60}.", None),
    "stop": (f"stop must be a string or a list of up to {MAX_STOPS} strings, got {{value!r:.60}}.", None),
    "min_tokens": ("min_tokens must be an integer from 0 to max_tokens ({max_tokens}), got {value!r}.", None),
    "ignore_eos": (FLAG, None), "include_stop_str_in_output": (FLAG, None), "skip_special_tokens": (FLAG, None),
    "echo": (FLAG, None),
    "n": (f"n must be an integer from 1 to {MAX_N}, got {{value!r:.60}}.", None),
    "best_of": (f"best_of must be an integer from n ({{n}}) to {MAX_N}, got {{value!r:.60}}.", None),
    "priority": (f"priority must be an integer from {-PRIORITY_RANGE} to {PRIORITY_RANGE} (lower runs first), got "
                 "{value!r}.", None),
    "stream": ("stream must be true or false, got {value!r}.", None),
    "stream_options": ("stream_options must be an object of include_usage and continuous_usage_stats booleans, got "
                       "{value!r:.60}.", None),
    "prompt": ("prompt must be a string or a list of token ids (or a list of them), got {value!r:.60}.", None),
    "messages": ("messages must be a non-empty list of {{role, content}} objects.", None),
    "top_logprobs": (f"top_logprobs must be an integer from 0 to {MAX_TOP_LOGPROBS}, got {{value!r:.60}}.", None),
}
LOGPROBS = {"text_completion": f"logprobs must be an integer from 0 to {MAX_COMPLETION_LOGPROBS}, got {{value!r:.60}}.",
            "chat.completion": FLAG}


def refused(exc: ValidationError, body: dict[str, Any], kind: str, given: dict[str, Any]) -> HTTPError:
    """The 400 of the first field ``exc`` refuses.

    Arguments:
        exc: the parse's errors; body: the JSON request body (a value inside a field is quoted as sent); kind:
        ``text_completion`` or ``chat.completion``; given: what was parsed (``max_tokens`` resolved; a sentence
        about min_tokens or best_of quotes it and ``n``).
    """
    error = exc.errors()[0]
    name = str(error["loc"][0])
    value = error["input"] if len(error["loc"]) == 1 else body.get(name)
    if error["type"] == "wire":  # a sampling extra the wire's row refused: its sentence, as the wire says it
        return HTTPError(str(error["msg"]), param=name)
    wrong_type, out_of_range = (LOGPROBS[kind], None) if name == "logprobs" else SENTENCES[name]
    sentence = out_of_range if out_of_range is not None and error["type"] in RANGE_ERRORS else wrong_type
    n = given.get("n") if isinstance(given.get("n"), int) else 1
    return HTTPError(sentence.format(name=name, value=value, max_tokens=given["max_tokens"], n=n), param=name)


def field_refusal(name: str, value: Any, **context: Any) -> HTTPError:
    """The 400 of ``name``'s own sentence (of a wrong type) quoting ``value``.

    Arguments:
        name: the field; value: the value found; context: what the sentence quotes beside it (``max_tokens``, ``n``).
    """
    return HTTPError(SENTENCES[name][0].format(name=name, value=value, **context), param=name)
