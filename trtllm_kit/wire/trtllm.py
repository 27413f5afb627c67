"""The ``tensorrt_llm`` model's request tensors (upstream's names and types, on the engine and cpu targets alike):
a ``GenerationRequest`` as numpy arrays, and back.

Beyond the table's scalars: the prompt is ``input_ids`` with ``input_lengths``; stop words are upstream's
``[2, N]`` word list (the ids concatenated, then each word's end offset, padded with -1); ``best_of`` has no tensor,
so ``num_return_sequences`` carries it with ``return_log_probs`` (the caller ranks the sequences by their
cumulative logprob); ``logprobs`` and ``prompt_logprobs`` share one ``num_top_log_probs`` (the larger), and prompt
logprobs asked with ``return_context_logits`` are the caller's to compute from the logits (the C++ backend's way),
so ``return_prompt_log_probs`` is not sent then. The LoRA inputs carry the task id and, when sent, the rows in the
model's ``lora_weights`` type. ``draft_input_ids`` carries the tokens a draft model proposed after the prompt (the
``tensorrt_llm_bls``'s draft-target loop); their ``draft_logits`` are refused, the kit's runtime verifying the ids
against its own tokens. A request with ``stop`` true is not a generation: it stops the running
requests of its request id.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from trtllm_kit.wire.fields import Dialect
from trtllm_kit.wire.lora import LoraAdapter, lora_tensors, weights_as, weights_from
from trtllm_kit.wire.request import FLAG, GenerationRequest
from trtllm_kit.wire.rules import Rule, WireError
from trtllm_kit.wire.scalars import (
    SCALARS,
    decode_scalars,
    encode_scalars,
    field_row,
    may_send,
    record,
    refuse_unsent,
)
from trtllm_kit.wire.tensor import Tensor, read_ids, read_scalar, read_strings, scalar_array, strings_array

REQUIRED = ("input_ids", "input_lengths", "request_output_len")
STRUCTURED = (
    Tensor("input_ids", "INT32", (-1,), True), Tensor("input_lengths", "INT32", (1,), True),
    Tensor("return_log_probs", "BOOL"), Tensor("return_prompt_log_probs", "BOOL"),
    Tensor("num_top_log_probs", "INT32"), Tensor("stop_words_list", "INT32", (2, -1)),
    Tensor("guided_decoding_guide_type", "STRING"), Tensor("guided_decoding_guide", "STRING"),
    Tensor("stop", "BOOL"),  # not a generation: stops the running requests with the same request id
    Tensor("draft_input_ids", "INT32", (-1,)),  # tokens drafted after the prompt, verified in the model's step
    Tensor("draft_logits", "FP32", (-1, -1)),  # their draft's logits: the engine's; the kit's runtime refuses them
)
HANDLED = ("prompt", "stop_words", "logprobs", "prompt_logprobs", "guide", "lora", "draft_ids")
SELF_ENCODED = ("n", "best_of")  # num_return_sequences carries best_of when it is larger than n


def request_tensors(weights_type: str = "FP32") -> tuple[Tensor, ...]:
    """Every request tensor the wire reads or writes, with its type and dims.

    Arguments:
        weights_type: ``lora_weights``' type (the model's dtype).
    """
    scalars = tuple(Tensor(name, str(r.wire.dtype), (1,), name in REQUIRED)
                    for r in SCALARS if (name := r.tensor("trtllm")) is not None)
    return (*STRUCTURED, *scalars, *lora_tensors(weights_type))


def word_list(words: tuple[tuple[int, ...], ...]) -> np.ndarray:
    """Token-id words as upstream's ``[2, N]`` word list (empty words left out).

    Arguments:
        words: each word's token ids.
    """
    kept = [word for word in words if word]
    ids = [t for word in kept for t in word]
    ends = np.cumsum([len(word) for word in kept]).tolist()
    return np.array([ids, ends + [-1] * (len(ids) - len(ends))], np.int32)


def words_of(array: np.ndarray, name: str = "stop_words_list") -> tuple[tuple[int, ...], ...]:
    """The words of a ``[2, N]`` word list (the batch dimension, if any, dropped).

    Arguments:
        array: the tensor; name: its name, for a refusal.
    """
    flat = np.asarray(array).reshape(-1)
    if flat.size % 2:
        raise WireError(name, f"{name} must be [2, N] (ids, then end offsets), got {flat.size} values; send "
                              "upstream's word list.")
    ids, offsets = flat.reshape(2, -1).tolist()
    ends = [int(o) for o in offsets if o >= 0]
    if any(b < a for a, b in zip([0, *ends], ends, strict=False)) or (ends and ends[-1] > len(ids)):
        raise WireError(name, f"{name}'s end offsets {ends[:8]} must rise and stay within its {len(ids)} ids; send "
                              "upstream's word list.")
    return tuple(tuple(int(t) for t in ids[start:end]) for start, end in zip([0, *ends], ends, strict=False)
                 if end > start)


def encode_lora(lora: LoraAdapter, dialect: Dialect, declared: Mapping[str, str] | None) -> dict[str, np.ndarray]:
    """The LoRA inputs of ``tensorrt_llm`` (or the ensemble and BLS, which pass them on): the task id, and the rows
    in the model's ``lora_weights`` type when the request carries them.

    Arguments:
        lora: the adapter; dialect: ``trtllm`` or ``text``; declared: the model's inputs (None: all).
    """
    may_send(field_row("lora"), dialect, declared)
    if lora.task_id is None:
        raise WireError("lora_task_id", f"lora_task_id is not set: this model names an adapter by its task id, and "
                                        f"the request names only {lora.name!r}; send the adapter's task id.")
    arrays = {"lora_task_id": scalar_array(lora.task_id, "UINT64")}
    if lora.weights is not None and lora.config is not None:
        datatype = "FP32" if declared is None else declared.get("lora_weights", "FP32")
        arrays["lora_weights"] = weights_as(lora.weights, datatype)
        arrays["lora_config"] = lora.config.astype(np.int32)
    return arrays


def decode_lora(arrays: Mapping[str, np.ndarray]) -> LoraAdapter | None:
    """The request's adapter from its LoRA inputs (None: the base model).

    Arguments:
        arrays: the request's tensors.
    """
    task_id = read_scalar(arrays, "lora_task_id")
    weights, config = arrays.get("lora_weights"), arrays.get("lora_config")
    if task_id is None and weights is None and config is None:
        return None
    rows = None if weights is None else weights_from(np.asarray(weights))
    return LoraAdapter(task_id=task_id, weights=None if rows is None else rows.reshape(-1, rows.shape[-1]),
                       config=None if config is None else np.asarray(config).reshape(-1, 3))


def encode_trtllm_request(req: GenerationRequest, declared: Mapping[str, str] | None = None) -> dict[str, np.ndarray]:
    """The request's ``tensorrt_llm`` tensors, without the batch dimension.

    Arguments:
        req: the request (token ids); declared: the model's inputs, name → type (None: every input of the dialect).
    """
    if isinstance(req.prompt, str):
        raise WireError("prompt", "prompt is text, and the tensorrt_llm model takes token ids; tokenize it, or send "
                                  "it to the text interface (ensemble, tensorrt_llm_bls) or an llmapi model.")
    if req.max_tokens is None:
        raise WireError("request_output_len", "request_output_len is required by the tensorrt_llm model; send "
                                              "max_tokens.")
    ids = np.asarray(req.prompt, np.int32)
    arrays = {"input_ids": ids, "input_lengths": np.array([ids.size], np.int32),
              **encode_scalars(req, "trtllm", declared, SELF_ENCODED)}
    if (req.n is not None or req.num_sequences > 1) and may_send(field_row("n"), "trtllm", declared):
        arrays["num_return_sequences"] = scalar_array(req.num_sequences, "INT32")
    if any(req.stop_words) and may_send(field_row("stop_words"), "trtllm", declared):
        arrays["stop_words_list"] = word_list(req.stop_words)
    if req.guide is not None and may_send(field_row("guide"), "trtllm", declared):
        arrays["guided_decoding_guide_type"], arrays["guided_decoding_guide"] = (strings_array([g]) for g in req.guide)
    if req.draft_ids and may_send(field_row("draft_ids"), "trtllm", declared):
        arrays["draft_input_ids"] = np.asarray(req.draft_ids, np.int32)
    arrays.update(_logprob_inputs(req, declared))
    if req.lora is not None:
        arrays.update(encode_lora(req.lora, "trtllm", declared))
    refuse_unsent(req, "trtllm", HANDLED, declared)
    return arrays


def _logprob_inputs(req: GenerationRequest, declared: Mapping[str, str] | None) -> dict[str, np.ndarray]:
    ranked = req.num_sequences > (req.n or 1)  # best_of: ranked by cumulative logprob
    if req.logprobs is None and req.prompt_logprobs is None and not ranked:
        return {}
    arrays = {"num_top_log_probs": scalar_array(max(req.logprobs or 0, req.prompt_logprobs or 0), "INT32")}
    if req.logprobs is not None or ranked:
        may_send(field_row("logprobs"), "trtllm", declared)
        arrays["return_log_probs"] = scalar_array(True, "BOOL")
    if req.prompt_logprobs is not None and not req.return_context_logits:
        may_send(field_row("prompt_logprobs"), "trtllm", declared)
        arrays["return_prompt_log_probs"] = scalar_array(True, "BOOL")
    return arrays


def decode_trtllm_request(arrays: Mapping[str, np.ndarray]) -> GenerationRequest:
    """The request ``tensorrt_llm`` tensors carry; a bad value is refused naming its tensor.

    Arguments:
        arrays: the request's tensors by name (with or without the batch dimension).
    """
    ids = read_ids(arrays, "input_ids")
    if not ids:
        raise WireError("input_ids", "input_ids is missing or empty; send the prompt's token ids.")
    if "request_output_len" not in arrays:
        raise WireError("request_output_len", "request_output_len is missing; send how many tokens to generate.")
    length = read_scalar(arrays, "input_lengths", Rule(int, 1, len(ids), meaning="(the ids in input_ids)"))
    values: dict[str, Any] = decode_scalars(arrays, "trtllm")
    values["prompt"] = ids if length is None else ids[:length]
    num_top = read_scalar(arrays, "num_top_log_probs", field_row("logprobs").rule) or 0
    if read_scalar(arrays, "return_log_probs", FLAG):
        values["logprobs"] = num_top
    if read_scalar(arrays, "return_prompt_log_probs", FLAG):
        values["prompt_logprobs"] = num_top
    if "stop_words_list" in arrays:
        values["stop_words"] = words_of(arrays["stop_words_list"])
    guide_type = read_strings(arrays, "guided_decoding_guide_type")
    if guide_type:
        values["guide"] = (guide_type[0], (read_strings(arrays, "guided_decoding_guide") or ("",))[0])
    if "draft_logits" in arrays:
        raise WireError("draft_logits", "draft_logits is not used by the CPU runtime, which verifies draft_input_ids "
                                        "against the target's own tokens; send use_draft_logits false.")
    values["draft_ids"] = read_ids(arrays, "draft_input_ids") or ()
    values["lora"] = decode_lora(arrays)
    return record(values, "trtllm")
