"""The wire's generation request as the CPU runtime runs it: ``SamplingParams`` from a ``wire.GenerationRequest``,
each field by name, an unset one at its row's default (``GenerationRequest.setting``).

Beam search does not run here: a ``beam_width`` other than 1 or a ``length_penalty`` other than 1.0 is refused,
naming its ``tensorrt_llm`` input, rather than answered differently.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trtllm_kit.errors import KitUsageError
from trtllm_kit.runtime.sequence import SamplingParams
from trtllm_kit.wire import GenerationRequest
from trtllm_kit.wire.scalars import field_row

if TYPE_CHECKING:
    from trtllm_kit.runtime.grammar import CompiledGuide

UNSUPPORTED = ("beam_width", "length_penalty")  # fields whose only value here is their row's default
SETTINGS = ("min_tokens", "temperature", "top_k", "top_p", "seed", "priority", "min_p", "repetition_penalty",
            "presence_penalty", "frequency_penalty")  # passed by name, unset ones at their row's default


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
    return SamplingParams(
        max_tokens=req.max_tokens, end_id=req.end_id, stop_words=[list(w) for w in req.stop_words if w],
        n=req.n or 1, logprobs=req.logprobs, prompt_logprobs=req.prompt_logprobs,
        return_context_logits=bool(req.return_context_logits),
        return_generation_logits=bool(req.return_generation_logits), guide=guide,
        keep_end_token=bool(req.keep_end_token), **{name: req.setting(name) for name in SETTINGS})
