"""LoRA in the generated repository: upstream's ``lora_task_id`` / ``lora_weights`` / ``lora_config`` inputs of
``tensorrt_llm`` with the backend's LoRA cache parameters, and the same inputs on the ensemble and the BLS, which
pass them through unchanged (docs/lora.md)."""

from __future__ import annotations

from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as mc

from trtllm_kit.defaults import DEFAULT_LORA_CACHE_OPTIMAL_ADAPTER_SIZE
from trtllm_kit.errors import KitUsageError
from trtllm_kit.model_repo import tensors as T
from trtllm_kit.model_repo.configs import model_input
from trtllm_kit.names import TRTLLM_MODEL
from trtllm_kit.spec.repo_options import RepoOptions

WEIGHTS_TYPES = {"float32": "FP32", "float16": "FP16", "bfloat16": "BF16"}  # checkpoint dtype → Triton type


@dataclass(frozen=True)
class LoraServing:
    """What a model that takes adapters is served with: the highest adapter rank and the weights' data type."""

    max_lora_rank: int
    weights_type: str  # lora_weights' Triton type without TYPE_: the model's dtype, which the backend demands

    @classmethod
    def of_dtype(cls, max_lora_rank: int, dtype: str) -> LoraServing:
        """The serving of a model whose activations are ``dtype`` (a checkpoint or engine dtype name).

        Arguments:
            max_lora_rank: the artifact's ``max_lora_rank``; dtype: ``float16``, ``bfloat16`` or ``float32``.
        """
        if dtype not in WEIGHTS_TYPES:
            raise KitUsageError(f"LoRA adapters need a float16, bfloat16 or float32 model, found {dtype!r}.")
        return cls(max_lora_rank, WEIGHTS_TYPES[dtype])


def cache_parameters(lora: LoraServing, options: RepoOptions) -> dict[str, str]:
    """The backend's LoRA cache parameters: pages sized for ``max_lora_rank`` (both sizes clamped to it, as the
    backend clamps them), and the host and GPU memory the options give.

    Arguments:
        lora: the model's LoRA serving; options: the repository options.
    """
    return {"lora_cache_optimal_adapter_size": str(min(DEFAULT_LORA_CACHE_OPTIMAL_ADAPTER_SIZE, lora.max_lora_rank)),
            "lora_cache_max_adapter_size": str(lora.max_lora_rank),
            "lora_cache_gpu_memory_fraction": repr(float(options.lora_cache_gpu_memory_fraction)),
            "lora_cache_host_memory_bytes": str(options.lora_cache_host_memory_bytes)}


def set_lora(configs: dict[str, mc.ModelConfig], lora: LoraServing, options: RepoOptions) -> None:
    """Declare the LoRA inputs on ``tensorrt_llm`` (with the cache parameters) and on the ensemble and BLS, which
    feed them to ``tensorrt_llm``.

    Arguments:
        configs: the repository's configs by model name; lora: the model's LoRA serving; options: resolved options.
    """
    inputs = T.lora_inputs(lora.weights_type)
    trtllm = configs[TRTLLM_MODEL]
    trtllm.input.extend(model_input(t, ragged=True, scalar_reshape=True) for t in inputs)
    for key, value in cache_parameters(lora, options).items():
        trtllm.parameters[key].string_value = value
    if "tensorrt_llm_bls" in configs:
        configs["tensorrt_llm_bls"].input.extend(model_input(t) for t in inputs)
    ensemble = configs.get("ensemble")
    if ensemble is not None:
        ensemble.input.extend(model_input(t) for t in inputs)
        step = next(s for s in ensemble.ensemble_scheduling.step if s.model_name == TRTLLM_MODEL)
        for tensor in inputs:
            step.input_map[tensor.name] = tensor.name
