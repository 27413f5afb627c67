"""Errors of the OpenAI frontend as OpenAI sends them: a JSON ``{"error": {...}}`` body, a 4xx status for what
the client got wrong, 429 with ``Retry-After`` for a full queue, and ``x-should-retry: false`` so the official
``openai`` client does not resend a request that will fail again. No traceback or server path reaches a client.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from trtllm_kit.serve.generation import GenerationError
from trtllm_kit.serve.openai.guided import model_refusal
from trtllm_kit.serve.openai.protocol import RequestError
from trtllm_kit.serve.openai.request_limits import MAX_JSON_DEPTH, json_depth_problem

RETRY_AFTER_S = 1
# Server messages of a full queue: the CPU runtime's, and Triton's own dynamic batcher's.
QUEUE_FULL = ("queue is full", "Exceeds maximum queue size")


def error_response(exc: RequestError) -> web.Response:
    """``exc`` as OpenAI's error body with its status; 429 and 503 carry ``Retry-After``.

    Arguments:
        exc: the refused request.
    """
    headers = {"x-should-retry": "false"}
    if exc.status in (429, 503):
        headers["Retry-After"] = str(RETRY_AFTER_S)
    return web.json_response(exc.body(), status=exc.status, headers=headers)


def generation_failure(exc: GenerationError, body: dict[str, Any] | None = None) -> RequestError:
    """What the client is told of a failed generation: a full queue is 429, a refusal 4xx (a refused guide a 400
    naming the request's field), the rest 5xx.

    Arguments:
        exc: the error the Triton client raised; body: the request's JSON body, when it has one.
    """
    message = first_line(str(exc))
    if any(marker in message for marker in QUEUE_FULL):
        return RequestError(f"the server's request queue is full; retry after {RETRY_AFTER_S} s. ({message})", 429,
                            kind="rate_limit_error", code="queue_full")
    refused = model_refusal(message, body)
    if refused is not None:
        return refused
    return RequestError(message, exc.status, kind="server_error" if exc.status >= 500 else "invalid_request_error")


def first_line(message: str) -> str:
    """A server message without the traceback the Python backend appends (``\\n\\nAt:\\n  /path/model.py(12)``).

    Arguments:
        message: an error message from the server.
    """
    return message.split("\n\nAt:")[0].split("\nAt:\n")[0].strip()


def parse_body(raw: bytes) -> dict[str, Any]:
    """A request body as a JSON object; anything else is a 400 that says what was found.

    Arguments:
        raw: the body's bytes.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(f"the request body is not UTF-8 (byte {raw[exc.start]:#04x} at offset {exc.start}).") \
            from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RequestError(f"the request body is not valid JSON: {exc.msg} at offset {exc.pos}.") from None
    except RecursionError:
        raise RequestError(f"the request body nests JSON deeper than {MAX_JSON_DEPTH} levels; flatten it.") from None
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(body).__name__}.")
    too_deep = json_depth_problem(body)
    if too_deep is not None:
        raise RequestError(too_deep)
    try:  # a lone surrogate ("\ud800") decodes to a str that no tokenizer or UTF-8 encoder takes
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError(f"the request body holds a lone UTF-16 surrogate ({exc.object[exc.start]!r}); send "
                           "valid Unicode text.") from None
    except (RecursionError, ValueError):
        raise RequestError(f"the request body nests JSON deeper than {MAX_JSON_DEPTH} levels; flatten it.") from None
    return body
