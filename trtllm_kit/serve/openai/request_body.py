"""A request's JSON body, decoded once and kept on the request, so that the gateway and the handler decide on the
same object: read as UTF-8 (JSON's encoding), refused with a 415 when the Content-Type declares another charset
and with a 413 when it is larger than the application's limit."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from trtllm_kit.serve.openai.errors import parse_body
from trtllm_kit.serve.openai.protocol import RequestError

BODY = web.RequestKey("json_body", dict[str, Any])
UTF8 = ("utf-8", "utf8")


async def json_body(request: web.Request) -> dict[str, Any]:
    """The request's body as a JSON object, parsed on the first call and the same object on every later one.

    Arguments:
        request: a POST request.
    """
    if BODY in request:
        return request[BODY]
    charset = request.charset
    if charset is not None and charset.strip().lower() not in UTF8:
        raise RequestError(f"the request body must be JSON in UTF-8, and its Content-Type declares charset "
                           f"{charset!r:.40}; send it as UTF-8 (charset=utf-8 or no charset).", 415,
                           code="unsupported_media_type")
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise RequestError(f"the request body is larger than this server's limit of {request.client_max_size} "
                           "bytes; send a shorter prompt.", 413, code="request_too_large") from None
    request[BODY] = parse_body(raw)
    return request[BODY]
