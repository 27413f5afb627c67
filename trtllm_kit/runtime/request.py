"""The wire's generation request as the CPU runtime runs it: ``SamplingParams`` from a ``wire.GenerationRequest``,
each field the two records share by name (``sequence.wire_rows``), an unset one at its row's default
(``GenerationRequest.setting``); the stop words and the compiled guide beside them.

Beam search does not run here: a field of beam search (its row's ``beams``) other than its row's default is
refused, naming its ``tensorrt_llm`` input, rather than answered differently.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trtllm_kit.errors import KitUsageError
from trtllm_kit.runtime.sequence import SamplingParams, wire_rows
from trtllm_kit.wire import GenerationRequest
from trtllm_kit.wire.fields import rows
from trtllm_kit.wire.scalars import field_row

if TYPE_CHECKING:
    from trtllm_kit.runtime.grammar import CompiledGuide

UNSUPPORTED = tuple(row.name for row in rows(GenerationRequest) if row.wire.beams)  # only their default runs here


def sampling_params(req: GenerationRequest, *, guide: CompiledGuide | None = None) -> SamplingParams:
    """The runtime's settings of ``req``.

    Arguments:
        req: the request (``max_tokens`` set); guide: its compiled guide, when it has one.
    """
    for name in UNSUPPORTED:
        value, default = getattr(req, name), field_row(name).wire.default
        if value is not None and value != default:
            tensor = field_row(name).tensor("trtllm")
            raise KitUsageError(f"input {tensor} = {value} is not supported by the CPU runtime (only {default}); "
                                "leave it out.")
    if req.max_tokens is None:
        raise KitUsageError("request_output_len is missing; send how many tokens to generate.")
    return SamplingParams(stop_words=[list(w) for w in req.stop_words if w], guide=guide, draft_ids=req.draft_ids,
                          **{row.name: req.setting(row.name) for row in wire_rows()})
