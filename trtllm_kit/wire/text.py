"""The text interface's request tensors (``ensemble`` and ``tensorrt_llm_bls``: ``text_input``, ``max_tokens``,
``stream``, the sampling inputs they pass to ``tensorrt_llm``, the LoRA inputs): a ``GenerationRequest`` with a
text prompt as numpy arrays. Their answers are ``tensorrt_llm``'s outputs plus ``text_output``, read by
``trtllm_response.decode_trtllm_response``.

The interface takes no token ids, stop words as ids, logprob counts, guide or disaggregation handle: a request
that sets a strict one of them is refused, the others are not sent (the frontend cuts stop strings itself).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from trtllm_kit.wire.lora import lora_tensors
from trtllm_kit.wire.request import GenerationRequest
from trtllm_kit.wire.rules import WireError
from trtllm_kit.wire.scalars import SCALARS, encode_scalars, refuse_unsent
from trtllm_kit.wire.tensor import Tensor, strings_array
from trtllm_kit.wire.trtllm import encode_lora

REQUIRED = ("text_input", "max_tokens")


def request_tensors(weights_type: str = "FP32") -> tuple[Tensor, ...]:
    """Every text-interface input the wire writes, with its type and dims.

    Arguments:
        weights_type: ``lora_weights``' type (the model's dtype).
    """
    scalars = tuple(Tensor(name, str(r.wire.dtype), (1,), name in REQUIRED)
                    for r in SCALARS if (name := r.tensor("text")) is not None)
    return (Tensor("text_input", "STRING", (1,), True), *scalars, *lora_tensors(weights_type))


def encode_text_request(req: GenerationRequest, declared: Mapping[str, str] | None = None) -> dict[str, np.ndarray]:
    """The request's text-interface tensors, without the batch dimension.

    Arguments:
        req: the request (text); declared: the model's inputs, name → type (None: every input of the interface).
    """
    if not isinstance(req.prompt, str):
        raise WireError("prompt", "prompt is token ids, and the text interface (ensemble, tensorrt_llm_bls) takes "
                                  "text; send the ids to the tensorrt_llm model, or send text.")
    if req.max_tokens is None:
        raise WireError("max_tokens", "max_tokens is required by the text interface; send it.")
    arrays = {"text_input": strings_array([req.prompt]), **encode_scalars(req, "text", declared)}
    if req.lora is not None:
        arrays.update(encode_lora(req.lora, "text", declared))
    refuse_unsent(req, "text", ("prompt", "lora"), declared)
    return arrays
