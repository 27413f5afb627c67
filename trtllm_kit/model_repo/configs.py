"""``config.pbtxt`` of each repository model, built as ``inference.ModelConfig`` protobuf messages.

Every parameter the TensorRT-LLM backend reads is set explicitly (``docs/triton-repo.md`` §3.2); keys that are
deliberately left to the backend's default are listed in ``BACKEND_DEFAULT_KEYS`` with the reason. Nothing
is templated: a value is either set from the engine, the plan and the options, or absent.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from trtllm_kit.artifact import EngineLimits
from trtllm_kit.model_repo import tensors as T
from trtllm_kit.names import TRTLLM_MODEL
from trtllm_kit.spec.repo_options import RepoOptions

SCHEMA = "tensorrtllm_backend inflight_batcher_llm, TensorRT-LLM 1.2.x"

# Backend parameters left unset on purpose: they belong to features the kit does not build.
BACKEND_DEFAULT_KEYS = {
    "encoder_model_path": "encoder-decoder models only",
    "cross_kv_cache_fraction": "encoder-decoder models only",
    "max_attention_window_size": "defaults to max_seq_len; no sliding-window models are built",
    "sink_token_length": "StreamingLLM only",
    "gpu_device_ids": "all visible GPUs; set by serve for orchestrator mode",
    "participant_ids": "orchestrator mode without spawning only",
    "num_nodes": "single node",
    "lora_cache_optimal_adapter_size": "set only for a model that takes LoRA adapters (model_repo/lora.py)",
    "lora_cache_max_adapter_size": "set only for a model that takes LoRA adapters (model_repo/lora.py)",
    "lora_cache_gpu_memory_fraction": "set only for a model that takes LoRA adapters (model_repo/lora.py)",
    "lora_cache_host_memory_bytes": "set only for a model that takes LoRA adapters (model_repo/lora.py)",
    "lora_prefetch_dir": "adapters come with requests (the OpenAI frontend sends them)",
    "executor_worker_path": "orchestrator mode only",
    "lookahead_window_size": "lookahead decoding only",
    "lookahead_ngram_size": "lookahead decoding only",
    "lookahead_verification_set_size": "lookahead decoding only",
    "medusa_choices": "Medusa only",
    "eagle_choices": "EAGLE only",
    "speculative_decoding_fast_logits": "speculative decoding only",
    "tokenizer_dir": "guided decoding only",
    "guided_decoding_backend": "guided decoding off",
    "xgrammar_tokenizer_info_path": "guided decoding off",
    "enable_trt_overlap": "deprecated",
    "cuda_graph_cache_size": "CUDA graphs off",
}


def _flag(value: bool | None) -> str:
    return "true" if value else "false"


def _dtype(name: str) -> int:
    return mc.DataType.Value(f"TYPE_{name}")


def model_input(tensor: T.Tensor, *, ragged: bool = False, scalar_reshape: bool = False) -> mc.ModelInput:
    """One ``input`` entry.

    Arguments:
        tensor: the table row; ragged: set ``allow_ragged_batch`` for variable-length dims;
        scalar_reshape: declare ``[1]`` with ``reshape { shape: [] }`` (as the tensorrt_llm model does).
    """
    message = mc.ModelInput(name=tensor.name, data_type=_dtype(tensor.data_type), dims=list(tensor.dims),
                            optional=not tensor.required)
    if ragged and -1 in tensor.dims:
        message.allow_ragged_batch = True
    if scalar_reshape and tensor.dims == (1,):
        message.reshape.SetInParent()
    return message


def model_output(tensor: T.Tensor) -> mc.ModelOutput:
    return mc.ModelOutput(name=tensor.name, data_type=_dtype(tensor.data_type), dims=list(tensor.dims))


def set_parameters(config: mc.ModelConfig, values: dict[str, str]) -> None:
    """Set (or replace) string parameters of a model config.

    Arguments:
        config: the model's config; values: parameter → value.
    """
    for key, value in values.items():
        config.parameters[key].string_value = value


def _queue(config: mc.ModelConfig, options: RepoOptions, preferred: int | None, max_queue_size: int = 0) -> None:
    batching = config.dynamic_batching
    batching.SetInParent()
    if preferred:
        batching.preferred_batch_size.append(preferred)
    batching.max_queue_delay_microseconds = options.max_queue_delay_microseconds
    batching.default_queue_policy.max_queue_size = max_queue_size


def _instances(config: mc.ModelConfig, count: int) -> None:
    config.instance_group.add(count=count, kind=mc.ModelInstanceGroup.KIND_CPU)


def tensorrt_llm_config(limits: EngineLimits, options: RepoOptions, model_path: Path) -> mc.ModelConfig:
    """The in-flight batching model: the C++ ``tensorrtllm`` backend, or the CPU runtime as a Python model.

    Arguments:
        limits: the engine's (or CPU runtime's) limits; options: resolved options;
        model_path: ``gpt_model_path``, the engine directory or (cpu) the checkpoint directory.
    """
    is_python = limits.slot_model is not None  # the kit's CPU runtime as a Python model
    config = mc.ModelConfig(name=TRTLLM_MODEL, backend="python" if is_python else "tensorrtllm",
                            max_batch_size=limits.max_batch_size)
    config.model_transaction_policy.decoupled = options.decoupled
    _queue(config, options, limits.max_batch_size, options.max_queue_size or 0)  # the engine's queue is the bound
    config.input.extend(model_input(t, ragged=True, scalar_reshape=True) for t in T.TRTLLM_INPUTS)
    config.output.extend(model_output(t) for t in (*T.TRTLLM_OUTPUTS, *T.LOGPROB_OUTPUTS, *T.DRAFT_OUTPUTS))
    _instances(config, 1)
    fraction = options.kv_cache_free_gpu_mem_fraction
    assert fraction is not None, "RepoOptions.resolve fills the KV fraction"
    parameters = {
        "max_beam_width": str(limits.max_beam_width),
        "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
        "gpt_model_type": "inflight_fused_batching",
        "gpt_model_path": str(model_path),
        "max_tokens_in_paged_kv_cache": str(options.max_tokens_in_paged_kv_cache),
        "batch_scheduler_policy": options.batch_scheduler_policy,
        "kv_cache_free_gpu_mem_fraction": repr(float(fraction)),
        "kv_cache_host_memory_bytes": "0",
        "kv_cache_onboard_blocks": "true",
        "exclude_input_in_output": _flag(options.exclude_input_in_output),
        "enable_kv_cache_reuse": _flag(options.enable_kv_cache_reuse),
        "enable_chunked_context": _flag(options.enable_chunked_context),
        "normalize_log_probs": "true",
        "cancellation_check_period_ms": "100",
        "stats_check_period_ms": "100",
        "iter_stats_max_iterations": "1000",
        "request_stats_max_iterations": "0",
        "decoding_mode": "top_k_top_p" if limits.max_beam_width == 1 else "beam_search",
        "gpu_weights_percent": "1.0",
        "enable_context_fmha_fp32_acc": "false",
        "multi_block_mode": "true",
        "cuda_graph_mode": "false",
    }
    if is_python:  # what the engine would carry, as parameters the CPU runtime reads
        parameters.update({"max_batch_size": str(limits.max_batch_size), "max_num_tokens": str(limits.max_num_tokens),
                           "max_seq_len": str(limits.max_seq_len), "tokens_per_block": str(limits.tokens_per_block),
                           "max_queue_size": str(options.max_queue_size or 0), "decoupled": _flag(options.decoupled)})
    set_parameters(config, parameters)
    return config


def set_guided_decoding(config: mc.ModelConfig, tokenizer_info_path: str) -> None:
    """Turn on guided decoding with xgrammar in the ``tensorrt_llm`` model's parameters.

    Arguments:
        config: the ``tensorrt_llm`` config; tokenizer_info_path: ``xgrammar_tokenizer_info_path`` (absolute for
        the C++ backend; the CPU runtime also resolves it against its model directory).
    """
    set_parameters(config, {"guided_decoding_backend": "xgrammar",
                             "xgrammar_tokenizer_info_path": tokenizer_info_path})


def preprocessing_config(limits: EngineLimits, options: RepoOptions, tokenizer_dir: Path) -> mc.ModelConfig:
    """Text → token ids, stop/bad-word lists, embedding bias, end and pad ids.

    Arguments:
        limits: the engine's limits; options: resolved options; tokenizer_dir: the copied tokenizer.
    """
    config = mc.ModelConfig(name="preprocessing", backend="python", max_batch_size=limits.max_batch_size)
    _queue(config, options, limits.max_batch_size)
    config.input.extend(model_input(t) for t in T.PREPROCESSING_INPUTS)
    config.output.extend(model_output(t) for t in T.PREPROCESSING_OUTPUTS)
    _instances(config, options.preprocessing_instances or 1)
    set_parameters(config, {"tokenizer_dir": str(tokenizer_dir), "add_special_tokens": "true"})
    return config


def postprocessing_config(limits: EngineLimits, options: RepoOptions, tokenizer_dir: Path) -> mc.ModelConfig:
    """Token ids → text.

    Arguments:
        limits: the engine's limits; options: resolved options; tokenizer_dir: the copied tokenizer.
    """
    config = mc.ModelConfig(name="postprocessing", backend="python", max_batch_size=limits.max_batch_size)
    config.dynamic_batching.SetInParent()
    config.input.extend(model_input(t) for t in T.POSTPROCESSING_INPUTS)
    config.output.extend(model_output(t) for t in T.POSTPROCESSING_OUTPUTS)
    _instances(config, options.postprocessing_instances or 1)
    set_parameters(config, {"tokenizer_dir": str(tokenizer_dir), "skip_special_tokens": "true"})
    return config


def _step(config: mc.ModelConfig, model_name: str, inputs: dict[str, str], outputs: dict[str, str]) -> None:
    step = config.ensemble_scheduling.step.add(model_name=model_name, model_version=-1)
    for key, value in inputs.items():
        step.input_map[key] = value
    for key, value in outputs.items():
        step.output_map[key] = value


def ensemble_config(limits: EngineLimits) -> mc.ModelConfig:
    """Text in → text out: preprocessing → tensorrt_llm → postprocessing.

    Arguments:
        limits: the engine's limits (for ``max_batch_size``).
    """
    config = mc.ModelConfig(name="ensemble", platform="ensemble", max_batch_size=limits.max_batch_size)
    config.input.extend(model_input(t) for t, _ in T.TEXT_INPUTS)
    config.output.extend(model_output(t) for t in T.TEXT_OUTPUTS)
    _step(config, "preprocessing", T.PREPROCESSING_FROM_TEXT,
          {out: internal for out, internal, _ in T.PREPROCESSING_TO_TRTLLM})
    trtllm_inputs = {target: internal for _, internal, target in T.PREPROCESSING_TO_TRTLLM}
    trtllm_inputs.update({target: t.name for t, target in T.TEXT_INPUTS if target})
    trtllm_outputs = {source: internal for source, internal, _ in T.TRTLLM_TO_POSTPROCESSING}
    trtllm_outputs.update({t.name: t.name for t in T.PASSTHROUGH_OUTPUTS})
    _step(config, TRTLLM_MODEL, trtllm_inputs, trtllm_outputs)
    _step(config, "postprocessing", {target: internal for _, internal, target in T.TRTLLM_TO_POSTPROCESSING},
          {"OUTPUT": "text_output"})
    return config


def bls_config(limits: EngineLimits, options: RepoOptions) -> mc.ModelConfig:
    """The Python alternative to the ensemble, with the same tensors; streams when decoupled.

    Arguments:
        limits: the engine's limits; options: resolved options.
    """
    config = mc.ModelConfig(name="tensorrt_llm_bls", backend="python", max_batch_size=limits.max_batch_size)
    config.model_transaction_policy.decoupled = options.decoupled
    config.input.extend(model_input(t) for t, _ in T.TEXT_INPUTS)
    config.output.extend(model_output(t) for t in T.TEXT_OUTPUTS)
    _instances(config, options.bls_instances or 1)
    set_parameters(config, {"tensorrt_llm_model_name": TRTLLM_MODEL, "accumulate_tokens": "true"})
    return config


def repository_configs(limits: EngineLimits, options: RepoOptions, model_path: Path,
                       tokenizer_dir: Path) -> dict[str, mc.ModelConfig]:
    """All five configs, keyed by model name.

    Arguments:
        limits: the engine's limits; options: options resolved against ``limits``;
        model_path: ``gpt_model_path``; tokenizer_dir: where the repository's tokenizer will live.
    """
    return {
        "preprocessing": preprocessing_config(limits, options, tokenizer_dir),
        TRTLLM_MODEL: tensorrt_llm_config(limits, options, model_path),
        "postprocessing": postprocessing_config(limits, options, tokenizer_dir),
        "ensemble": ensemble_config(limits),
        "tensorrt_llm_bls": bls_config(limits, options),
    }


def to_text(config: mc.ModelConfig) -> str:
    """Serialise with ``text_format`` (what Triton parses)."""
    return text_format.MessageToString(config)


def parse_config(text: str) -> mc.ModelConfig:
    """Parse ``config.pbtxt`` text; raises ``text_format.ParseError`` with line and column.

    Arguments:
        text: the file's content.
    """
    return text_format.Parse(text, mc.ModelConfig())
