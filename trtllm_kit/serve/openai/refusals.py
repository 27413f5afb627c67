"""What the frontend says of a field the typed parse refused: one sentence per field, naming it and quoting the value
found, as OpenAI's 400 with ``param`` set. The parse's library says where and what kind of error (``loc``,
``type``); the sentence is the frontend's own, so a client reads the same text whichever check caught the value.
Each request class says its own fields' sentences beside them (its ``sentences``, a ``Sentences`` table)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from trtllm_kit.serve.http.errors import HTTPError

PRIORITY_RANGE = 100  # OpenAI ``priority`` (vLLM's: lower first, default 0) spans -100..100
RANGE_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}
FLAG = "{name} must be true or false, got {value!r:.60}."
# field → (the sentence of a wrong type, the sentence of a value out of range; None: the same), each quoting
# ``{value}`` and naming the field as ``{name}``
Sentences = dict[str, tuple[str, str | None]]


def refused(exc: ValidationError, body: dict[str, Any], sentences: Sentences, given: dict[str, Any]) -> HTTPError:
    """The 400 of the first field ``exc`` refuses.

    Arguments:
        exc: the parse's errors; body: the JSON request body (a value inside a field is quoted as sent); sentences:
        the request class's; given: what was parsed (``max_tokens`` resolved; a sentence may quote it and ``n``).
    """
    error = exc.errors()[0]
    name = str(error["loc"][0])
    value = error["input"] if len(error["loc"]) == 1 else body.get(name)
    if error["type"] == "wire":  # a sampling extra the wire's row refused: its sentence, as the wire says it
        return HTTPError(str(error["msg"]), param=name)
    wrong_type, out_of_range = sentences[name]
    sentence = out_of_range if out_of_range is not None and error["type"] in RANGE_ERRORS else wrong_type
    n = given.get("n") if isinstance(given.get("n"), int) else 1
    return HTTPError(sentence.format(name=name, value=value, max_tokens=given["max_tokens"], n=n), param=name)


def field_refusal(sentences: Sentences, name: str, value: Any, **context: Any) -> HTTPError:
    """The 400 of ``name``'s own sentence (of a wrong type) quoting ``value``.

    Arguments:
        sentences: the request class's; name: the field; value: the value found; context: what the sentence quotes
        beside it (``max_tokens``, ``n``).
    """
    return HTTPError(sentences[name][0].format(name=name, value=value, **context), param=name)
