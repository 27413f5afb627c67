"""The ``tensorrt_llm`` model's response tensors (upstream's outputs and the kit's logprob outputs), and the text
interface's (the same, passed through by ``ensemble`` and ``tensorrt_llm_bls``, plus ``text_output``): a
``GenerationResponse`` as numpy arrays, and back.

Shapes as declared, without the batch dimension: ``output_ids`` [beams, T] (one beam), ``sequence_length`` [beams]
(a reader takes that many of ``output_ids``), ``output_log_probs`` [beams, T], ``cum_log_probs`` [beams],
``top_log_probs`` / ``top_log_prob_ids`` [beams, T, k], ``generation_logits`` [beams, T, V]; per prompt token
``prompt_log_probs`` [P], ``prompt_top_log_probs`` / ``prompt_top_log_prob_ids`` [P, k], ``context_logits`` [P, V];
the counts, ``sequence_index`` and the timing outputs [1].
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields

import numpy as np

from trtllm_kit.wire.logprobs import read_scored, scored_arrays
from trtllm_kit.wire.response import DraftAcceptance, GenerationResponse, Perf
from trtllm_kit.wire.tensor import Tensor, read_ids, read_scalar, read_strings, scalar_array

RESPONSE_TENSORS = (
    Tensor("output_ids", "INT32", (-1, -1)), Tensor("sequence_length", "INT32", (-1,)),
    Tensor("cum_log_probs", "FP32", (-1,)), Tensor("output_log_probs", "FP32", (-1, -1)),
    Tensor("context_logits", "FP32", (-1, -1)), Tensor("generation_logits", "FP32", (-1, -1, -1)),
    Tensor("sequence_index", "INT32"), Tensor("kv_cache_alloc_new_blocks", "INT32"),
    Tensor("kv_cache_reused_blocks", "INT32"), Tensor("kv_cache_alloc_total_blocks", "INT32"),
    Tensor("arrival_time_ns", "INT64"), Tensor("first_token_time_ns", "INT64"), Tensor("last_token_time_ns", "INT64"),
    Tensor("num_input_tokens", "INT32"), Tensor("num_output_tokens", "INT32"),
    Tensor("top_log_probs", "FP32", (-1, -1, -1)), Tensor("top_log_prob_ids", "INT32", (-1, -1, -1)),
    Tensor("prompt_log_probs", "FP32", (-1,)), Tensor("prompt_top_log_probs", "FP32", (-1, -1)),
    Tensor("prompt_top_log_prob_ids", "INT32", (-1, -1)),
)
TEXT_OUTPUT = Tensor("text_output", "STRING", (-1,))  # the text interface's, beside the outputs above
# A speculating sequence's counts so far, cumulative as ``num_output_tokens`` (the BLS's acceptance output names,
# and the kit's count of verifying steps): DraftAcceptance field → tensor.
DRAFT_ACCEPTANCE = {"num_drafts": Tensor("total_drafts", "INT32"),
                    "num_draft_tokens": Tensor("total_draft_tokens", "INT32"),
                    "num_accepted_tokens": Tensor("total_accepted_draft_tokens", "INT32")}
PERF = {f.name: "INT64" if f.name.endswith("_ns") else "INT32" for f in fields(Perf)}


def encode_trtllm_response(response: GenerationResponse) -> dict[str, np.ndarray]:
    """The response's ``tensorrt_llm`` tensors, without the batch dimension (``texts`` are the text interface's,
    which its BLS writes).

    Arguments:
        response: what the response carries.
    """
    ids = np.array([response.token_ids], np.int32)
    arrays: dict[str, np.ndarray] = {"output_ids": ids, "sequence_length": np.array([ids.shape[1]], np.int32)}
    for name in ("sequence_index", "num_input_tokens", "num_output_tokens"):
        value = getattr(response, name)
        if value is not None:
            arrays[name] = scalar_array(value, "INT32")
    k = response.num_top
    if response.scored is not None:
        logprobs, values, top_ids = scored_arrays(response.scored, k)
        arrays["output_log_probs"] = logprobs[None]
        if k:
            arrays["top_log_probs"], arrays["top_log_prob_ids"] = values[None], top_ids[None]
    if response.cum_logprobs:
        arrays["cum_log_probs"] = np.array(response.cum_logprobs, np.float32)
    if response.generation_logits is not None:
        arrays["generation_logits"] = np.asarray(response.generation_logits, np.float32)[None]
    if response.prompt_scored is not None:
        logprobs, values, top_ids = scored_arrays(response.prompt_scored, k)
        arrays["prompt_log_probs"] = logprobs
        if k:
            arrays["prompt_top_log_probs"], arrays["prompt_top_log_prob_ids"] = values, top_ids
    if response.context_logits is not None:
        arrays["context_logits"] = np.asarray(response.context_logits, np.float32)
    if response.perf is not None:
        arrays.update({name: scalar_array(getattr(response.perf, name), datatype) for name, datatype in PERF.items()})
    if response.draft_acceptance is not None:
        arrays.update(draft_acceptance_arrays(response.draft_acceptance))
    return arrays


def draft_acceptance_arrays(acceptance: DraftAcceptance) -> dict[str, np.ndarray]:
    """A sequence's speculation counts as their tensors (the llmapi model's too).

    Arguments:
        acceptance: the counts.
    """
    return {t.name: scalar_array(getattr(acceptance, field), t.data_type) for field, t in DRAFT_ACCEPTANCE.items()}


def read_draft_acceptance(arrays: Mapping[str, np.ndarray]) -> DraftAcceptance | None:
    """The speculation counts a response's tensors carry (None unless all three are there).

    Arguments:
        arrays: the response's tensors by name.
    """
    if not all(t.name in arrays for t in DRAFT_ACCEPTANCE.values()):
        return None
    return DraftAcceptance(**{field: int(read_scalar(arrays, t.name)) for field, t in DRAFT_ACCEPTANCE.items()})


def _logits(arrays: Mapping[str, np.ndarray], name: str) -> np.ndarray | None:
    array = arrays.get(name)
    return None if array is None else np.asarray(array, np.float32).reshape(-1, np.asarray(array).shape[-1])


def decode_trtllm_response(arrays: Mapping[str, np.ndarray],
                           prompt_ids: tuple[int, ...] | None = None) -> GenerationResponse:
    """The response ``tensorrt_llm`` (or text-interface) tensors carry (with or without the batch dimension).

    Arguments:
        arrays: the response's tensors by name; prompt_ids: the request's prompt, to which prompt logprobs belong
        (None: they are not read).
    """
    ids = read_ids(arrays, "output_ids") or ()
    if "sequence_length" in arrays:
        ids = ids[:int(np.asarray(arrays["sequence_length"]).reshape(-1)[0])]
    scored = read_scored(arrays, "output_", ids, is_prompt=False)
    prompt = read_scored(arrays, "prompt_", prompt_ids, is_prompt=True) if prompt_ids is not None else None
    perf = None
    if all(name in arrays for name in PERF):
        perf = Perf(**{name: int(read_scalar(arrays, name)) for name in PERF})
    cum = arrays.get("cum_log_probs")
    return GenerationResponse(
        token_ids=ids, texts=read_strings(arrays, "text_output") or (),
        sequence_index=read_scalar(arrays, "sequence_index"), num_input_tokens=read_scalar(arrays, "num_input_tokens"),
        num_output_tokens=read_scalar(arrays, "num_output_tokens"),
        cum_logprobs=() if cum is None else tuple(float(v) for v in np.asarray(cum).reshape(-1)),
        num_top=max(scored[1] if scored else 0, prompt[1] if prompt else 0),
        scored=None if scored is None else scored[0], prompt_scored=None if prompt is None else prompt[0],
        context_logits=_logits(arrays, "context_logits"), generation_logits=_logits(arrays, "generation_logits"),
        perf=perf, draft_acceptance=read_draft_acceptance(arrays))
