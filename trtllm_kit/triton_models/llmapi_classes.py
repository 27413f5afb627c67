"""The LLM API's classes the llmapi model runs: TensorRT-LLM's where it and a GPU are present, else the kit's CPU
runtime behind the same interface (``trtllm_kit.llmapi.cpu_llm``); nothing else differs.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class LlmClasses(NamedTuple):
    """``LLM``, ``SamplingParams``, ``GuidedDecodingParams``, ``LoRARequest`` and ``DisaggregatedParams`` of one
    implementation, and whether it is the kit's CPU runtime."""

    llm: Any
    sampling_params: Any
    guided_decoding_params: Any
    lora_request: Any
    disaggregated_params: Any
    on_cpu: bool


def llm_classes() -> LlmClasses:
    """``tensorrt_llm``'s classes with a GPU, else the kit's CPU ones."""
    try:
        import torch

        if torch.cuda.is_available():
            from tensorrt_llm import LLM, SamplingParams
            from tensorrt_llm.executor.request import LoRARequest
            from tensorrt_llm.llmapi import DisaggregatedParams
            from tensorrt_llm.sampling_params import GuidedDecodingParams

            return LlmClasses(LLM, SamplingParams, GuidedDecodingParams, LoRARequest, DisaggregatedParams, False)
    except ImportError:
        pass
    from trtllm_kit.llmapi.cpu_llm import LLM, DisaggregatedParams, GuidedDecodingParams, LoRARequest, SamplingParams

    return LlmClasses(LLM, SamplingParams, GuidedDecodingParams, LoRARequest, DisaggregatedParams, True)
