"""A request's JSON body, decoded once and kept on the request, so that the gateway and the handler decide on the
same object: read as UTF-8 (JSON's encoding), refused with a 415 when the Content-Type declares another charset,
with a 413 when it is larger than the application's limit, and with a 400 when it is not one JSON object of at
most ``MAX_JSON_DEPTH`` levels in valid Unicode."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from trtllm_kit.serve.http.errors import HTTPError

BODY = web.RequestKey("json_body", dict[str, Any])
UTF8 = ("utf-8", "utf8")
MAX_JSON_DEPTH = 32  # objects and lists inside one another; chat content parts need 5


async def json_body(request: web.Request) -> dict[str, Any]:
    """The request's body as a JSON object, parsed on the first call and the same object on every later one.

    Arguments:
        request: a POST request.
    """
    if BODY in request:
        return request[BODY]
    charset = request.charset
    if charset is not None and charset.strip().lower() not in UTF8:
        raise HTTPError(f"the request body must be JSON in UTF-8, and its Content-Type declares charset "
                        f"{charset!r:.40}; send it as UTF-8 (charset=utf-8 or no charset).", 415,
                        code="unsupported_media_type")
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise HTTPError(f"the request body is larger than this server's limit of {request.client_max_size} "
                        "bytes; send a shorter prompt.", 413, code="request_too_large") from None
    request[BODY] = parse_body(raw)
    return request[BODY]


def parse_body(raw: bytes) -> dict[str, Any]:
    """A request body as a JSON object; anything else is a 400 that says what was found.

    Arguments:
        raw: the body's bytes.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HTTPError(f"the request body is not UTF-8 (byte {raw[exc.start]:#04x} at offset {exc.start}).") \
            from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HTTPError(f"the request body is not valid JSON: {exc.msg} at offset {exc.pos}.") from None
    except RecursionError:
        raise HTTPError(f"the request body nests JSON deeper than {MAX_JSON_DEPTH} levels; flatten it.") from None
    if not isinstance(body, dict):
        raise HTTPError(f"the request body must be a JSON object, got {type(body).__name__}.")
    too_deep = json_depth_problem(body)
    if too_deep is not None:
        raise HTTPError(too_deep)
    try:  # a lone surrogate ("\ud800") decodes to a str that no tokenizer or UTF-8 encoder takes
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise HTTPError(f"the request body holds a lone UTF-16 surrogate ({exc.object[exc.start]!r}); send "
                        "valid Unicode text.") from None
    except (RecursionError, ValueError):
        raise HTTPError(f"the request body nests JSON deeper than {MAX_JSON_DEPTH} levels; flatten it.") from None
    return body


def json_depth_problem(value: Any) -> str | None:
    """A sentence when ``value`` nests deeper than ``MAX_JSON_DEPTH``, else None (walked without recursion).

    Arguments:
        value: a parsed JSON value.
    """
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, dict | list):
                if depth + 1 > MAX_JSON_DEPTH:
                    return f"the request body nests JSON deeper than {MAX_JSON_DEPTH} levels; flatten it."
                stack.append((child, depth + 1))
    return None
