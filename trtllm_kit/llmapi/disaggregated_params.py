"""``tensorrt_llm.llmapi.DisaggregatedParams`` with upstream's field names, and its OpenAI wire form.

A ``context_only`` request runs the prefill and returns one token and the parameters that let a generation
server continue it (``first_gen_tokens``, ``ctx_request_id``, ``opaque_state``); the caller sets
``request_type="generation_only"`` on them and sends the same prompt to the generation server. On the wire
(``disaggregated_params`` in an OpenAI request body or response choice, and the llmapi Triton model's tensor of
that name) ``opaque_state`` travels base64-encoded as ``encoded_opaque_state``.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

REQUEST_TYPES = ("context_only", "generation_only", "context_and_generation")
WIRE_LISTS = ("first_gen_tokens", "draft_tokens")
WIRE_INTS = ("ctx_request_id", "disagg_request_id")


@dataclass(kw_only=True)
class DisaggregatedParams:
    """What a context server hands a generation server (``tensorrt_llm.llmapi.DisaggregatedParams``).

    Arguments:
        request_type: ``context_only``, ``generation_only`` or ``context_and_generation`` (any case);
        first_gen_tokens: the token(s) the context phase made; ctx_request_id: its request id there;
        opaque_state: the transceiver's state (where and how to fetch the KV blocks), opaque to the caller;
        draft_tokens: speculative drafts (none on the CPU runtime); disagg_request_id: an id both sides share.
    """

    request_type: str | None = None
    first_gen_tokens: list[int] | None = None
    ctx_request_id: int | None = None
    opaque_state: bytes | None = None
    draft_tokens: list[int] | None = None
    disagg_request_id: int | None = None

    def __post_init__(self) -> None:
        if self.request_type is not None:
            self.request_type = str(self.request_type).lower()
            if self.request_type not in REQUEST_TYPES:
                raise ValueError(f"request_type is {self.request_type!r}; use one of {', '.join(REQUEST_TYPES)}")

    def to_wire(self) -> dict[str, Any]:
        """The OpenAI wire object (``opaque_state`` base64 in ``encoded_opaque_state``), without unset fields."""
        wire: dict[str, Any] = {"request_type": self.request_type}
        wire.update({name: getattr(self, name) for name in (*WIRE_LISTS, *WIRE_INTS)
                     if getattr(self, name) is not None})
        if self.opaque_state is not None:
            wire["encoded_opaque_state"] = base64.b64encode(self.opaque_state).decode()
        return wire

    @classmethod
    def from_wire(cls, wire: Any) -> DisaggregatedParams:
        """Read the OpenAI wire object; a wrong type raises ``ValueError`` naming the field.

        Arguments:
            wire: the decoded JSON object.
        """
        if not isinstance(wire, dict):
            raise ValueError(f"disaggregated_params must be an object, got {type(wire).__name__}")
        values: dict[str, Any] = {"request_type": wire.get("request_type")}
        for name in WIRE_LISTS:
            value = wire.get(name)
            if value is not None and (not isinstance(value, list) or not all(type(t) is int for t in value)):
                raise ValueError(f"disaggregated_params.{name} must be a list of token ids, got {value!r}")
            values[name] = value
        for name in WIRE_INTS:
            value = wire.get(name)
            if value is not None and type(value) is not int:
                raise ValueError(f"disaggregated_params.{name} must be an integer, got {value!r}")
            values[name] = value
        encoded = wire.get("encoded_opaque_state")
        if encoded is not None:
            try:
                values["opaque_state"] = base64.b64decode(str(encoded), validate=True)
            except ValueError:
                raise ValueError("disaggregated_params.encoded_opaque_state is not base64") from None
        return cls(**values)
