"""What the client is told of a failed generation (``serve/http/errors.py`` sends it): a 4xx status for what the
client got wrong, 429 for a full queue, 5xx for the rest, the server's traceback cut off."""

from __future__ import annotations

from trtllm_kit.serve.generation import GenerationError
from trtllm_kit.serve.http.errors import RETRY_AFTER_S, HTTPError
from trtllm_kit.serve.openai.guided import model_refusal

# Server messages of a full queue: the CPU runtime's, and Triton's own dynamic batcher's.
QUEUE_FULL = ("queue is full", "Exceeds maximum queue size")


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
    return HTTPError(message, exc.status, kind="server_error" if exc.status >= 500 else "invalid_request_error")


def first_line(message: str) -> str:
    """A server message without the traceback the Python backend appends (``\\n\\nAt:\\n  /path/model.py(12)``).

    Arguments:
        message: an error message from the server.
    """
    return message.split("\n\nAt:")[0].split("\nAt:\n")[0].strip()
