"""``tensorrt_llm.llmapi.DisaggregatedParams`` with upstream's field names, and its OpenAI wire form.

A ``context_only`` request runs the prefill and returns one token and the parameters that let a generation
server continue it (``first_gen_tokens``, ``ctx_request_id``, ``opaque_state``); the caller sets
``request_type="generation_only"`` on them and sends the same prompt to the generation server. On the wire
(``disaggregated_params`` in an OpenAI request body or response choice, and the llmapi Triton model's tensor of
that name) ``opaque_state`` travels base64-encoded as ``encoded_opaque_state``: the wire's ``DisaggHandle`` reads and
writes that form, and these parameters are its fields as upstream's mutable class.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from trtllm_kit.wire.disagg import REQUEST_TYPES, DisaggHandle
from trtllm_kit.wire.rules import WireError

FIELDS = tuple(f.name for f in fields(DisaggHandle))  # upstream's fields, the same on both


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
        return handle_of(self).to_wire()

    @classmethod
    def from_wire(cls, wire: Any) -> DisaggregatedParams:
        """Read the OpenAI wire object; a wrong type raises ``ValueError`` naming the field.

        Arguments:
            wire: the decoded JSON object.
        """
        try:
            return params_of(DisaggHandle.from_wire(wire), cls)
        except WireError as exc:
            raise ValueError(str(exc)) from None


def handle_of(params: Any) -> DisaggHandle:
    """The wire's handle of a ``DisaggregatedParams`` (the kit's or TensorRT-LLM's); a wrong type raises
    ``ValueError`` naming the field.

    Arguments:
        params: the parameters (fields it lacks are unset).
    """
    try:
        return DisaggHandle(**{name: getattr(params, name, None) for name in FIELDS})
    except WireError as exc:
        raise ValueError(str(exc)) from None


def params_of(handle: DisaggHandle, params_class: Any = DisaggregatedParams) -> Any:
    """The ``DisaggregatedParams`` of a wire handle (token lists as lists, unset fields left out).

    Arguments:
        handle: the decoded handle; params_class: the kit's class or TensorRT-LLM's.
    """
    values = {name: getattr(handle, name) for name in FIELDS if getattr(handle, name) is not None}
    return params_class(**{name: list(v) if isinstance(v, tuple) else v for name, v in values.items()})
