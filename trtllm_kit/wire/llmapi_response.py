"""The llmapi model's response tensors: a ``GenerationResponse`` as numpy arrays, and back (unbatched).

Every response carries ``text_output`` (one text per completion it reports), ``output_ids`` (the first
completion's tokens: streamed, the new ones), ``num_input_tokens`` and ``num_output_tokens`` (the completion's
tokens so far); on request ``finish_reason``, ``stop_reason`` and ``cumulative_logprob`` per completion,
``sequence_index``, the logprob outputs ([T] and [T, k]; per prompt token [P] and [P, k'], in a completion's first
response: the LLM API counts the two kinds of alternatives apart), from a context-only request,
``disaggregated_params``, and from a completion that speculated (the CPU ``LLM``'s) its counts so far under the
``tensorrt_llm`` model's names (``total_drafts``, ``total_draft_tokens``, ``total_accepted_draft_tokens``).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from trtllm_kit.wire.disagg import DisaggHandle
from trtllm_kit.wire.logprobs import read_scored, scored_arrays
from trtllm_kit.wire.response import GenerationResponse
from trtllm_kit.wire.tensor import Tensor, read_ids, read_scalar, read_strings, scalar_array, strings_array
from trtllm_kit.wire.trtllm_response import DRAFT_ACCEPTANCE, draft_acceptance_arrays, read_draft_acceptance

RESPONSE_TENSORS = (
    Tensor("text_output", "STRING", (-1,)), Tensor("finish_reason", "STRING", (-1,)),
    Tensor("stop_reason", "STRING", (-1,)), Tensor("cumulative_logprob", "FP32", (-1,)),
    Tensor("output_ids", "INT32", (-1,)), Tensor("num_input_tokens", "INT32", (1,)),
    Tensor("num_output_tokens", "INT32", (1,)), Tensor("sequence_index", "INT32", (1,)),
    Tensor("output_log_probs", "FP32", (-1,)), Tensor("top_log_probs", "FP32", (-1, -1)),
    Tensor("top_log_prob_ids", "INT32", (-1, -1)), Tensor("prompt_log_probs", "FP32", (-1,)),
    Tensor("prompt_top_log_probs", "FP32", (-1, -1)), Tensor("prompt_top_log_prob_ids", "INT32", (-1, -1)),
    Tensor("disaggregated_params", "STRING", (1,)), *DRAFT_ACCEPTANCE.values(),
)


def encode_llmapi_response(response: GenerationResponse) -> dict[str, np.ndarray]:
    """The response's llmapi tensors.

    Arguments:
        response: what the response carries.
    """
    arrays = {"text_output": strings_array(response.texts), "output_ids": np.array(response.token_ids, np.int32)}
    for name in ("num_input_tokens", "num_output_tokens", "sequence_index"):
        value = getattr(response, name)
        if value is not None:
            arrays[name] = scalar_array(value, "INT32")
    if response.finish_reasons:
        arrays["finish_reason"] = strings_array(response.finish_reasons)
    if response.stop_reasons:
        arrays["stop_reason"] = strings_array(response.stop_reasons)
    if response.cum_logprobs:
        arrays["cumulative_logprob"] = np.array(response.cum_logprobs, np.float32)
    if response.disaggregated is not None:
        arrays["disaggregated_params"] = strings_array([response.disaggregated.to_json()])
    if response.draft_acceptance is not None:
        arrays.update(draft_acceptance_arrays(response.draft_acceptance))
    prompt_k = response.num_top if response.num_prompt_top is None else response.num_prompt_top
    for prefix, top, scored, k in (("output_", "top_", response.scored, response.num_top),
                                   ("prompt_", "prompt_top_", response.prompt_scored, prompt_k)):
        if scored is not None:
            logprobs, values, ids = scored_arrays(scored, k)
            arrays[f"{prefix}log_probs"] = logprobs
            if k:
                arrays[f"{top}log_probs"], arrays[f"{top}log_prob_ids"] = values, ids
    return arrays


def decode_llmapi_response(arrays: Mapping[str, np.ndarray],
                           prompt_ids: tuple[int, ...] | None = None) -> GenerationResponse:
    """The response llmapi tensors carry.

    Arguments:
        arrays: the response's tensors by name; prompt_ids: the request's prompt, to which prompt logprobs belong
        (None: they are not read).
    """
    ids = read_ids(arrays, "output_ids") or ()
    scored = read_scored(arrays, "output_", ids, is_prompt=False)
    prompt = read_scored(arrays, "prompt_", prompt_ids, is_prompt=True) if prompt_ids is not None else None
    handle = (read_strings(arrays, "disaggregated_params") or ("",))[0]
    cum = arrays.get("cumulative_logprob")
    return GenerationResponse(
        token_ids=ids, texts=read_strings(arrays, "text_output") or (),
        sequence_index=read_scalar(arrays, "sequence_index"), num_input_tokens=read_scalar(arrays, "num_input_tokens"),
        num_output_tokens=read_scalar(arrays, "num_output_tokens"),
        cum_logprobs=() if cum is None else tuple(float(v) for v in np.asarray(cum).reshape(-1)),
        num_top=scored[1] if scored else prompt[1] if prompt else 0,
        num_prompt_top=prompt[1] if scored and prompt and prompt[1] != scored[1] else None,
        scored=None if scored is None else scored[0], prompt_scored=None if prompt is None else prompt[0],
        finish_reasons=read_strings(arrays, "finish_reason") or (),
        stop_reasons=read_strings(arrays, "stop_reason") or (),
        disaggregated=DisaggHandle.from_json(handle) if handle else None,
        draft_acceptance=read_draft_acceptance(arrays))
