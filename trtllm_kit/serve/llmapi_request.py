"""Requests to the llmapi target's ``tensorrt_llm`` model (upstream's ``llmapi`` tensors plus the kit's token-id
extras, ``targets/llmapi_repo.py``): the one place the kit's clients (``generate``, the OpenAI frontend, ``bench``)
spell that interface. A model speaks it when its inputs include ``sampling_param_max_tokens``; it takes text
(``text_input``) and token ids (``input_ids``) alike, unbatched (``max_batch_size: 0``), and answers with
``text_output``, ``output_ids`` and the cumulative ``num_input_tokens``/``num_output_tokens``."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from trtllm_kit.model_repo.tensors import NEVER_END_ID

MARKER = "sampling_param_max_tokens"
# the stop strings, and whether the engine keeps a matched one in its output (``SamplingParams.stop`` and
# ``include_stop_str_in_output``)
STOP_INPUT = "sampling_param_stop"
INCLUDE_STOP_INPUT = "sampling_param_include_stop_str_in_output"
# GenerationRequest field → (llmapi input, Triton datatype, numpy dtype)
SAMPLING = {"temperature": ("sampling_param_temperature", "FP32", np.float32),
            "top_p": ("sampling_param_top_p", "FP32", np.float32),
            "top_k": ("sampling_param_top_k", "INT32", np.int32),
            "seed": ("sampling_param_seed", "UINT64", np.uint64),
            "min_tokens": ("sampling_param_min_tokens", "INT32", np.int32),
            "end_id": ("sampling_param_end_id", "INT32", np.int32),
            "min_p": ("sampling_param_min_p", "FP32", np.float32),
            "repetition_penalty": ("sampling_param_repetition_penalty", "FP32", np.float32),
            "presence_penalty": ("sampling_param_presence_penalty", "FP32", np.float32),
            "frequency_penalty": ("sampling_param_frequency_penalty", "FP32", np.float32),
            "n": ("sampling_param_n", "INT32", np.int32), "best_of": ("sampling_param_best_of", "INT32", np.int32),
            "logprobs": ("sampling_param_logprobs", "INT32", np.int32),
            "prompt_logprobs": ("sampling_param_prompt_logprobs", "INT32", np.int32),
            "priority": ("priority", "FP32", np.float32),  # only to a model that declares it (older repos do not)
            "keep_end_token": ("keep_end_token", "BOOL", np.bool_)}  # the same


def speaks_llmapi(inputs: Iterable[str]) -> bool:
    """Whether a model with these input names has the llmapi interface.

    Arguments:
        inputs: the model config's input names.
    """
    return MARKER in set(inputs)


def llmapi_values(prompt: str | tuple[int, ...] | list[int], max_tokens: int, *, streaming: bool = True,
                  **sampling: float | int | None) -> list[tuple[str, str, np.ndarray]]:
    """The request's tensors as ``(name, datatype, array)``, unbatched.

    Arguments:
        prompt: text, or token ids; max_tokens: tokens to generate; streaming: one response per step;
        sampling: the keys of ``SAMPLING``
        (None: the model's default; ``NEVER_END_ID``: ``ignore_eos``).
    """
    if isinstance(prompt, str):
        values = [("text_input", "BYTES", np.array([prompt.encode()], dtype=np.object_))]
    else:
        values = [("input_ids", "INT32", np.asarray(prompt, dtype=np.int32))]
    values += [(MARKER, "INT32", np.array([max_tokens], np.int32)), ("streaming", "BOOL", np.array([streaming])),
               ("return_finish_reason", "BOOL", np.array([True]))]
    if sampling.get("end_id") == NEVER_END_ID:  # "no end id" is spelt ignore_eos in the LLM API
        sampling = {**sampling, "end_id": None}
        values.append(("sampling_param_ignore_eos", "BOOL", np.array([True])))
    for field, value in sampling.items():
        if value is not None:
            name, datatype, dtype = SAMPLING[field]
            values.append((name, datatype, np.array([value], dtype=dtype)))
    return values
