"""The llmapi model's request tensors (upstream's ``llmapi`` interface, ``sampling_param_*``, plus the kit's
``input_ids``, ``priority``, ``keep_end_token``, guide, LoRA and disaggregation inputs): a ``GenerationRequest`` as
numpy arrays, and back. The model is unbatched (``max_batch_size: 0``): arrays go as they are.

Beyond the table's scalars: the prompt is ``text_input`` or ``input_ids``; ``end_id`` -1 (no end token) is the LLM
API's ``sampling_param_ignore_eos``; stop strings go as ``sampling_param_stop`` only to a model that also takes
``sampling_param_include_stop_str_in_output``; an adapter is named by ``lora_name``; the disaggregation handle is
one JSON object.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from trtllm_kit.wire.disagg import DisaggHandle
from trtllm_kit.wire.lora import LoraAdapter
from trtllm_kit.wire.request import FLAG, NEVER_END_ID, GenerationRequest
from trtllm_kit.wire.rules import WireError
from trtllm_kit.wire.scalars import SCALARS, decode_scalars, encode_scalars, field_row, may_send, record, refuse_unsent
from trtllm_kit.wire.tensor import Tensor, read_ids, read_scalar, read_strings, scalar_array, strings_array

MARKER = "sampling_param_max_tokens"  # a model whose inputs include it speaks this dialect
STOP_INPUT = "sampling_param_stop"
INCLUDE_STOP_INPUT = "sampling_param_include_stop_str_in_output"
IGNORE_EOS = "sampling_param_ignore_eos"
STRUCTURED = (
    Tensor("text_input", "STRING", (-1,)), Tensor("input_ids", "INT32", (-1,)),
    Tensor(STOP_INPUT, "STRING", (-1,)), Tensor(IGNORE_EOS, "BOOL", (1,)),
    Tensor("sampling_param_logprobs", "INT32", (1,)), Tensor("sampling_param_prompt_logprobs", "INT32", (1,)),
    Tensor("guided_decoding_guide_type", "STRING", (1,)), Tensor("guided_decoding_guide", "STRING", (1,)),
    Tensor("lora_name", "STRING", (1,)), Tensor("disaggregated_params", "STRING", (1,)),
    Tensor("stop", "BOOL", (1,)),  # not a generation: aborts the running requests with the same request id
)
HANDLED = ("prompt", "stop_strings", "logprobs", "prompt_logprobs", "guide", "lora", "disaggregated")
LOGPROB_INPUTS = {"logprobs": "sampling_param_logprobs", "prompt_logprobs": "sampling_param_prompt_logprobs"}


def request_tensors() -> tuple[Tensor, ...]:
    """Every llmapi input the wire reads or writes, with its type and dims."""
    scalars = tuple(Tensor(name, str(r.wire.dtype), (1,)) for r in SCALARS if (name := r.tensor("llmapi")))
    return (*STRUCTURED, *scalars)


def speaks_llmapi(inputs: Mapping[str, str] | set[str]) -> bool:
    """Whether a model with these inputs has the llmapi interface.

    Arguments:
        inputs: the model config's input names.
    """
    return MARKER in inputs


def encode_llmapi_request(req: GenerationRequest, declared: Mapping[str, str] | None = None) -> dict[str, np.ndarray]:
    """The request's llmapi tensors.

    Arguments:
        req: the request (text or token ids); declared: the model's inputs, name → type (None: every input of the
        dialect).
    """
    if isinstance(req.prompt, str):
        arrays = {"text_input": strings_array([req.prompt])}
    else:
        arrays = {"input_ids": np.asarray(req.prompt, np.int32)}
    arrays.update(encode_scalars(req, "llmapi", declared))
    if req.end_id == NEVER_END_ID:  # "no end token" is spelt ignore_eos in the LLM API
        arrays.pop("sampling_param_end_id", None)
        if declared is None or IGNORE_EOS in declared:
            arrays[IGNORE_EOS] = scalar_array(True, "BOOL")
    if req.stop_strings and may_send(field_row("stop_strings"), "llmapi", declared, (STOP_INPUT, INCLUDE_STOP_INPUT)):
        arrays[STOP_INPUT] = strings_array(req.stop_strings)
    for name, tensor in LOGPROB_INPUTS.items():
        value = getattr(req, name)
        if value is not None and may_send(field_row(name), "llmapi", declared):
            arrays[tensor] = scalar_array(value, "INT32")
    if req.guide is not None and may_send(field_row("guide"), "llmapi", declared):
        arrays["guided_decoding_guide_type"], arrays["guided_decoding_guide"] = (strings_array([g]) for g in req.guide)
    if req.lora is not None and may_send(field_row("lora"), "llmapi", declared):
        if not req.lora.name:
            raise WireError("lora_name", f"lora_name is not set: the llmapi model names an adapter by name, and the "
                                         f"request has only task id {req.lora.task_id}; send the adapter's name.")
        arrays["lora_name"] = strings_array([req.lora.name])
    if req.disaggregated is not None and may_send(field_row("disaggregated"), "llmapi", declared):
        arrays["disaggregated_params"] = strings_array([req.disaggregated.to_json()])
    refuse_unsent(req, "llmapi", HANDLED, declared)
    return arrays


def decode_llmapi_request(arrays: Mapping[str, np.ndarray]) -> GenerationRequest:
    """The request llmapi tensors carry; a bad value is refused naming its tensor.

    Arguments:
        arrays: the request's tensors by name.
    """
    ids, texts = read_ids(arrays, "input_ids"), read_strings(arrays, "text_input")
    if ids is None and not texts:
        raise WireError("text_input", "text_input and input_ids are both missing; send text_input (a prompt) or "
                                      "input_ids (token ids).")
    prompt = ids if ids is not None else (texts or ("",))[0]
    if not prompt:
        name = "input_ids" if ids is not None else "text_input"
        raise WireError(name, f"{name} is empty; send a prompt of at least one character or token id.")
    values: dict[str, Any] = decode_scalars(arrays, "llmapi")
    values["prompt"] = prompt
    values.setdefault("max_tokens", None)  # absent: the LLM API's default
    if read_scalar(arrays, IGNORE_EOS, FLAG):
        values["end_id"] = NEVER_END_ID
    values["stop_strings"] = read_strings(arrays, STOP_INPUT) or ()
    for name, tensor in LOGPROB_INPUTS.items():
        values[name] = read_scalar(arrays, tensor, field_row(name).rule)
    guide_type = read_strings(arrays, "guided_decoding_guide_type")
    if guide_type:
        values["guide"] = (guide_type[0], (read_strings(arrays, "guided_decoding_guide") or ("",))[0])
    name = (read_strings(arrays, "lora_name") or ("",))[0]
    values["lora"] = LoraAdapter(name=name) if name else None
    handle = (read_strings(arrays, "disaggregated_params") or ("",))[0]
    values["disaggregated"] = DisaggHandle.from_json(handle) if handle else None
    return record(values, "llmapi")
