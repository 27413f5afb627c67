"""The disaggregation handle: what a context server hands a generation server, in the OpenAI wire form that the
llmapi model's ``disaggregated_params`` tensor carries (a JSON object; upstream's ``DisaggregatedParams`` fields,
``opaque_state`` base64-encoded as ``encoded_opaque_state``).

A ``context_only`` request runs the prefill and returns one token with a handle (``first_gen_tokens``,
``ctx_request_id``, ``opaque_state``); the caller sets ``request_type`` ``generation_only`` on it and sends the
same prompt to the generation server.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

from trtllm_kit.wire.rules import WireError

REQUEST_TYPES = ("context_only", "generation_only", "context_and_generation")
TOKEN_LISTS = ("first_gen_tokens", "draft_tokens")
INTEGERS = ("ctx_request_id", "disagg_request_id")
FIELD = "disaggregated_params"


def _refused(name: str, allowed: str, value: Any) -> WireError:
    return WireError(f"{FIELD}.{name}", f"{FIELD}.{name} must be {allowed}, got {value!r:.60}; send the handle a "
                                        "context-only response returned.")


@dataclass(frozen=True)
class DisaggHandle:
    """A context-only or generation-only request's parameters (upstream's ``DisaggregatedParams``).

    Arguments:
        request_type: one of ``REQUEST_TYPES`` (any case); first_gen_tokens: the token(s) the context phase made;
        ctx_request_id: its request id there; opaque_state: where and how to fetch the KV blocks, opaque to the
        caller; draft_tokens: speculative drafts; disagg_request_id: an id both sides share.
    """

    request_type: str | None = None
    first_gen_tokens: tuple[int, ...] | None = None
    ctx_request_id: int | None = None
    opaque_state: bytes | None = None
    draft_tokens: tuple[int, ...] | None = None
    disagg_request_id: int | None = None

    def __post_init__(self) -> None:
        if self.request_type is not None:
            kind = str(self.request_type).lower()
            if kind not in REQUEST_TYPES:
                raise _refused("request_type", f"one of {', '.join(REQUEST_TYPES)}", self.request_type)
            object.__setattr__(self, "request_type", kind)
        for name in TOKEN_LISTS:
            value = getattr(self, name)
            if value is not None:
                if not isinstance(value, list | tuple) or not all(type(t) is int and t >= 0 for t in value):
                    raise _refused(name, "a list of token ids", value)
                object.__setattr__(self, name, tuple(value))
        for name in INTEGERS:
            value = getattr(self, name)
            if value is not None and type(value) is not int:
                raise _refused(name, "an integer", value)
        if self.opaque_state is not None and not isinstance(self.opaque_state, bytes):
            raise _refused("opaque_state", "bytes", self.opaque_state)

    def to_wire(self) -> dict[str, Any]:
        """The OpenAI wire object, without unset fields."""
        wire: dict[str, Any] = {}
        for name in ("request_type", *TOKEN_LISTS, *INTEGERS):
            value = getattr(self, name)
            if value is not None:
                wire[name] = list(value) if name in TOKEN_LISTS else value
        if self.opaque_state is not None:
            wire["encoded_opaque_state"] = base64.b64encode(self.opaque_state).decode()
        return wire

    @classmethod
    def from_wire(cls, wire: Any) -> DisaggHandle:
        """Read the OpenAI wire object; unknown keys are ignored, as upstream's server ignores them.

        Arguments:
            wire: the decoded JSON object.
        """
        if not isinstance(wire, dict):
            raise WireError(FIELD, f"{FIELD} must be a JSON object, got {wire!r:.60}; send the handle a context-only "
                                   "response returned.")
        values = {name: wire.get(name) for name in ("request_type", *TOKEN_LISTS, *INTEGERS)}
        encoded = wire.get("encoded_opaque_state")
        if encoded is not None:
            try:
                values["opaque_state"] = base64.b64decode(str(encoded), validate=True)
            except (binascii.Error, ValueError):
                raise _refused("encoded_opaque_state", "base64", encoded) from None
        return cls(**values)

    def to_json(self) -> str:
        """The tensor's text: the wire object as JSON."""
        return json.dumps(self.to_wire())

    @classmethod
    def from_json(cls, text: str) -> DisaggHandle:
        """Read the tensor's text.

        Arguments:
            text: a JSON object in the wire form.
        """
        try:
            wire = json.loads(text)
        except ValueError:
            raise WireError(FIELD, f"{FIELD} is not JSON ({text[:60]!r}); send the handle a context-only response "
                                   "returned, as a JSON object.") from None
        return cls.from_wire(wire)
