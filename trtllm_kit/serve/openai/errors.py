"""What the client is told of a failed generation (``serve/http/errors.py`` sends it): a 4xx status for what the
client got wrong, 429 for a full queue, 5xx for the rest, the server's traceback cut off.

A refusal (400) names the request's field (``param``) when its sentence names a wire field an OpenAI body carries,
by the field's name or by its tensor in any dialect: the sentence then calls it by its OpenAI name (a model refusing
a tensor whose name differs from its field's refuses the field, as the wire's row names it).
"""

from __future__ import annotations

import re

from trtllm_kit.serve.generation import GenerationError
from trtllm_kit.serve.http.errors import RETRY_AFTER_S, HTTPError
from trtllm_kit.serve.openai.guided import model_refusal
from trtllm_kit.wire import GenerationRequest
from trtllm_kit.wire.fields import DIALECTS, rows

# Server messages of a full queue: the CPU runtime's, and Triton's own dynamic batcher's.
QUEUE_FULL = ("queue is full", "Exceeds maximum queue size")
# each name a refusal may call a field by that an OpenAI body carries (the field's, its tensors') → its OpenAI name
OPENAI_NAMES = {name: row.openai for row in rows(GenerationRequest) if row.openai is not None
                for name in (row.name, *(t for dialect in DIALECTS for t in row.tensors(dialect)))}
NAMED = re.compile(r"\b(" + "|".join(sorted(OPENAI_NAMES, key=len, reverse=True)) + r")\b")


def generation_failure(exc: GenerationError, guide_field: str | None = None) -> HTTPError:
    """What the client is told of a failed generation: a full queue is 429, a refusal 4xx (a refused guide a 400
    naming the request's field), the rest 5xx.

    Arguments:
        exc: the error the Triton client raised; guide_field: the request's structured-output field, when it has
        one.
    """
    message = first_line(str(exc))
    if any(marker in message for marker in QUEUE_FULL):
        return HTTPError(f"the server's request queue is full; retry after {RETRY_AFTER_S} s. ({message})", 429,
                         kind="rate_limit_error", code="queue_full")
    refused = model_refusal(message, guide_field)
    if refused is not None:
        return refused
    if exc.status == 400:
        return field_refusal(message)
    return HTTPError(message, exc.status, kind="server_error" if exc.status >= 500 else "invalid_request_error")


def field_refusal(message: str) -> HTTPError:
    """A refusal's 400: its sentence, the first field it names that an OpenAI body carries called by its OpenAI name
    and given as ``param`` (None: it names none).

    Arguments:
        message: the refusal's sentence.
    """
    found = NAMED.search(message)
    if found is None:
        return HTTPError(message)
    name = OPENAI_NAMES[found.group(1)]
    return HTTPError(f"{message[:found.start()]}{name}{message[found.end():]}", param=name)


def first_line(message: str) -> str:
    """A server message without the traceback the Python backend appends (``\\n\\nAt:\\n  /path/model.py(12)``).

    Arguments:
        message: an error message from the server.
    """
    return message.split("\n\nAt:")[0].split("\nAt:\n")[0].strip()
