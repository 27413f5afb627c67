"""The ``opaque_state`` a context server hands out: where its KV blocks wait, signed so that a generation server
connects only to endpoints its own context peers advertised.

The state is a JSON object ``{"endpoint", "handle", "mac"}``; ``mac`` is the HMAC-SHA256 of the endpoint and
handle under the transfer key both roles share. ``serve --disagg`` draws a key per launch and hands it to both
tritonservers in ``TRTLLM_KIT_KV_KEY`` (an environment only the serve's user and root can read); an ``LLM`` whose
environment holds no key draws its own, so only its own context-only requests can be continued by it. A state
whose signature does not match is refused before anything connects anywhere, with a sentence that names no path.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Mapping

KV_KEY_ENV = "TRTLLM_KIT_KV_KEY"
MAX_STATE_BYTES = 1024  # a signed state is about 200 bytes
FORGED = ("disaggregated_params.encoded_opaque_state was not made by a context server of this serve ({}); send the "
          "context-only response's disaggregated_params unchanged")


class ForgedStateError(ValueError):
    """An ``opaque_state`` no context peer of this server signed (the client's mistake: answered 400)."""


def transfer_key(environ: Mapping[str, str] = os.environ) -> bytes:
    """The key that signs and checks states: ``TRTLLM_KIT_KV_KEY`` when set, else a fresh random one.

    Arguments:
        environ: the process environment.
    """
    value = environ.get(KV_KEY_ENV)
    return value.encode() if value else secrets.token_bytes(32)


def _mac(key: bytes, endpoint: str, handle: str) -> str:
    return hmac.new(key, json.dumps([endpoint, handle]).encode(), hashlib.sha256).hexdigest()


def sign(key: bytes, endpoint: str, handle: str) -> bytes:
    """The ``opaque_state`` naming ``endpoint`` and ``handle``.

    Arguments:
        key: the transfer key; endpoint: the context server's socket path; handle: the offer's handle.
    """
    return json.dumps({"endpoint": endpoint, "handle": handle, "mac": _mac(key, endpoint, handle)}).encode()


def verify(key: bytes, opaque_state: bytes) -> tuple[str, str]:
    """The endpoint and handle of a state this key signed; ``ForgedStateError`` for any other.

    Arguments:
        key: the transfer key; opaque_state: from a generation-only request.
    """
    if len(opaque_state) > MAX_STATE_BYTES:
        raise ForgedStateError(FORGED.format(f"it has {len(opaque_state)} bytes, a signed one at most "
                                             f"{MAX_STATE_BYTES}"))
    try:
        state = json.loads(opaque_state)
        endpoint, handle, mac = state["endpoint"], state["handle"], state["mac"]
        if not all(isinstance(value, str) for value in (endpoint, handle, mac)):
            raise TypeError
        signed = hmac.compare_digest(_mac(key, endpoint, handle).encode(), mac.encode())
    except (ValueError, KeyError, TypeError, RecursionError):
        raise ForgedStateError(FORGED.format("it is not a signed state")) from None
    if not signed:
        raise ForgedStateError(FORGED.format("its signature does not match"))
    return endpoint, handle
