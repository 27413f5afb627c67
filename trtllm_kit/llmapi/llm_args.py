"""The field table of TensorRT-LLM 1.2.x ``TorchLlmArgs`` (the ``LLM()`` arguments of the PyTorch backend) and
the check every ``model.yaml`` / ``extra_llm_api_options.yaml`` key passes before it is written.

Read from ``tensorrt_llm/llmapi/llm_args.py`` of the 1.1/1.2 line (the version that still has ``TrtLlmArgs``
and ``build_config``; docs/llmapi-confirmed.md says which). ``BaseLlmArgs`` and every nested config forbid
unknown keys (``extra="forbid"``), so a typo would stop the server at start-up: the kit refuses it at build
time with the nearest valid key. docs/llmapi-llm-args.md is ``render_table()`` of this data.
"""

from __future__ import annotations

import difflib
from typing import Any

from trtllm_kit.errors import KitUsageError

Fields = dict[str, str]  # name → type / allowed values, as the upstream annotation reads

KV_CACHE_CONFIG: Fields = {
    "enable_block_reuse": "bool = True", "max_tokens": "int | None", "max_attention_window": "list[int] | None",
    "sink_token_length": "int | None", "free_gpu_memory_fraction": "float in [0, 1] = 0.9",
    "host_cache_size": "int | None (bytes)", "onboard_blocks": "bool = True",
    "cross_kv_cache_fraction": "float | None", "secondary_offload_min_priority": "int | None",
    "event_buffer_max_size": "int = 0", "attention_dp_events_gather_period_ms": "int = 5",
    "enable_partial_reuse": "bool = True", "copy_on_partial_reuse": "bool = True", "use_uvm": "bool = False",
    "max_gpu_total_bytes": "int >= 0 = 0", "dtype": "str = auto (auto, fp8, or a torch dtype)",
    "mamba_ssm_cache_dtype": "auto | float16 | bfloat16 | float32", "tokens_per_block": "int = 32",
}
DYNAMIC_BATCH_CONFIG: Fields = {
    "enable_batch_size_tuning": "bool", "enable_max_num_tokens_tuning": "bool",
    "dynamic_batch_moving_average_window": "int",
}
SCHEDULER_CONFIG: Fields = {
    "capacity_scheduler_policy": "MAX_UTILIZATION | GUARANTEED_NO_EVICT | STATIC_BATCH = GUARANTEED_NO_EVICT",
    "context_chunking_policy": "FIRST_COME_FIRST_SERVED | EQUAL_PROGRESS | None",
    "dynamic_batch_config": "DynamicBatchConfig | None (TensorRT backend only)",
}
CUDA_GRAPH_CONFIG: Fields = {
    "batch_sizes": "list[int] | None", "max_batch_size": "int >= 0 = 0 (neither given: 128)",
    "enable_padding": "bool = False",
}
TORCH_COMPILE_CONFIG: Fields = {
    "enable_fullgraph": "bool = True", "enable_inductor": "bool = False", "enable_piecewise_cuda_graph": "bool = False",
    "capture_num_tokens": "list[int] | None", "enable_userbuffers": "bool = True", "max_num_streams": "int >= 1 = 1",
}
MOE_CONFIG: Fields = {
    "backend": "CUTLASS | CUTEDSL | WIDEEP | TRTLLM | DEEPGEMM | VANILLA | TRITON = CUTLASS",
    "max_num_tokens": "int | None", "load_balancer": "MoeLoadBalancerConfig | dict | str | None",
    "disable_finalize_fusion": "bool = False", "use_low_precision_moe_combine": "bool = False",
}
ATTENTION_DP_CONFIG: Fields = {"enable_balance": "bool = False", "timeout_iters": "int = 50",
                               "batching_wait_iters": "int = 10"}
CACHE_TRANSCEIVER_CONFIG: Fields = {"backend": "DEFAULT | UCX | NIXL | MPI | None",
                                    "max_tokens_in_buffer": "int | None", "kv_transfer_timeout_ms": "int > 0 | None"}
PEFT_CACHE_CONFIG: Fields = {name: "int" for name in (
    "num_host_module_layer", "num_device_module_layer", "optimal_adapter_size", "max_adapter_size", "num_put_workers",
    "num_ensure_workers", "num_copy_streams", "max_pages_per_block_host", "max_pages_per_block_device")}
PEFT_CACHE_CONFIG.update({"device_cache_percent": "float = 0.02", "host_cache_size": "int = 1 GiB",
                          "lora_prefetch_dir": "None (prefetch is rejected)"})

LORA_CONFIG: Fields = {
    "lora_dir": "list[str] = [] (at most one)", "lora_ckpt_source": "hf | nemo = hf", "max_lora_rank": "int = 64",
    "lora_target_modules": "list[str] = [] (TensorRT-LLM names; empty: every module)",
    "trtllm_modules_to_hf_modules": "dict[str, str] = {} (the default map)", "max_loras": "int | None",
    "max_cpu_loras": "int | None", "swap_gate_up_proj_lora_b_weight": "bool = True",
}

BASE_LLM_ARGS: Fields = {
    "model": "str | Path (required)", "tokenizer": "str | Path | None", "tokenizer_mode": "auto | slow",
    "skip_tokenizer_init": "bool = False", "trust_remote_code": "bool = False", "tensor_parallel_size": "int = 1",
    "dtype": "str = auto", "revision": "str | None", "tokenizer_revision": "str | None",
    "pipeline_parallel_size": "int = 1", "context_parallel_size": "int = 1", "gpus_per_node": "int | None",
    "moe_cluster_parallel_size": "int | None", "moe_tensor_parallel_size": "int | None",
    "moe_expert_parallel_size": "int | None", "enable_attention_dp": "bool = False",
    "enable_lm_head_tp_in_adp": "bool = False", "cp_config": "dict", "load_format": "auto | dummy",
    "fail_fast_on_attention_window_too_large": "bool = False", "enable_lora": "bool = False",
    "lora_config": "LoraConfig | None", "kv_cache_config": "KvCacheConfig", "enable_chunked_prefill": "bool = False",
    "guided_decoding_backend": "xgrammar | llguidance | None", "batched_logits_processor": "object | None",
    "iter_stats_max_iterations": "int | None", "request_stats_max_iterations": "int | None",
    "peft_cache_config": "PeftCacheConfig | None", "scheduler_config": "SchedulerConfig",
    "cache_transceiver_config": "CacheTransceiverConfig | None", "sparse_attention_config": "rocket | dsa | None",
    "speculative_config": "Eagle | MTP | NGram | DraftTarget | ... | None", "max_batch_size": "int | None",
    "max_input_len": "int | None (1024)", "max_seq_len": "int | None (from the model)",
    "max_beam_width": "int | None", "max_num_tokens": "int = 8192", "gather_generation_logits": "bool = False",
    "num_postprocess_workers": "int = 0", "postprocess_tokenizer_dir": "str | None",
    "reasoning_parser": "str | None", "decoding_config": "object | None (deprecated)",
    "mpi_session": "object | None (alias _mpi_session)", "backend": "str | None (None → pytorch)",
    "return_perf_metrics": "bool = False", "orchestrator_type": "rpc | ray | None",
}
TORCH_LLM_ARGS: Fields = {
    **BASE_LLM_ARGS,
    "build_config": "object | None (deprecated, ignored)", "garbage_collection_gen0_threshold": "int = 20000",
    "cuda_graph_config": "CudaGraphConfig | None (null disables)", "attention_dp_config": "AttentionDpConfig | None",
    "disable_overlap_scheduler": "bool = False", "moe_config": "MoeConfig", "attn_backend": "str = TRTLLM",
    "sampler_type": "TRTLLMSampler | TorchSampler | auto", "enable_iter_perf_stats": "bool = False",
    "enable_iter_req_stats": "bool = False", "print_iter_log": "bool = False", "perf_metrics_max_requests": "int = 0",
    "batch_wait_timeout_ms": "float >= 0 = 0", "batch_wait_timeout_iters": "int >= 0 = 0",
    "batch_wait_max_tokens_ratio": "float in [0, 1] = 0", "torch_compile_config": "TorchCompileConfig | None",
    "enable_autotuner": "bool = True", "enable_layerwise_nvtx_marker": "bool = False",
    "load_format": "auto | dummy | vision_only", "enable_min_latency": "bool = False", "stream_interval": "int > 0 = 1",
    "force_dynamic_quantization": "bool = False",
    "allreduce_strategy": "AUTO | NCCL | UB | MINLATENCY | ONESHOT | TWOSHOT | LOWPRECISION | MNNVL | NCCL_SYMMETRIC",
    "checkpoint_loader": "object | None", "checkpoint_format": "str | None (None → HF)",
    "kv_connector_config": "KvCacheConnectorConfig | None", "mm_encoder_only": "bool = False",
    "ray_worker_extension_cls": "str | None",
}
NESTED: dict[str, Fields] = {
    "kv_cache_config": KV_CACHE_CONFIG, "scheduler_config": SCHEDULER_CONFIG, "cuda_graph_config": CUDA_GRAPH_CONFIG,
    "torch_compile_config": TORCH_COMPILE_CONFIG, "moe_config": MOE_CONFIG, "attention_dp_config": ATTENTION_DP_CONFIG,
    "cache_transceiver_config": CACHE_TRANSCEIVER_CONFIG, "peft_cache_config": PEFT_CACHE_CONFIG,
    "lora_config": LORA_CONFIG,
    "scheduler_config.dynamic_batch_config": DYNAMIC_BATCH_CONFIG,
}
# model.yaml keys the Triton llmapi model consumes itself (excluded from the LLM arguments)
TRITON_ONLY: Fields = {"triton_config": "max_batch_size, decoupled, cancellation_check_period_ms",
                       "logits_post_processors": "name → module:attr"}
TRITON_CONFIG: Fields = {"max_batch_size": "int (keep 0)", "decoupled": "bool",
                         "cancellation_check_period_ms": "int = 100"}
ENUMS = {
    "scheduler_config.capacity_scheduler_policy": ("MAX_UTILIZATION", "GUARANTEED_NO_EVICT", "STATIC_BATCH"),
    "scheduler_config.context_chunking_policy": ("FIRST_COME_FIRST_SERVED", "EQUAL_PROGRESS"),
    "attn_backend": ("TRTLLM", "FLASHINFER", "VANILLA"),
    "kv_cache_config.dtype": ("auto", "fp8", "float16", "bfloat16", "float32"),
    "backend": ("pytorch",),
}


def check_llm_args(values: dict[str, Any], *, triton: bool = False) -> None:
    """Refuse any key that is not a 1.2.x ``TorchLlmArgs`` field (nested configs included), naming the nearest
    valid key; and an enum value outside its choices.

    Arguments:
        values: the YAML mapping; triton: it is a ``model.yaml`` (``triton_config`` and ``logits_post_processors``
        are then allowed, and ``triton_config`` is checked too).
    """
    top = {**TORCH_LLM_ARGS, **(TRITON_ONLY if triton else {})}
    _check_keys(values, top, "")
    for name, value in values.items():
        table = TRITON_CONFIG if name == "triton_config" else NESTED.get(name)
        if table is not None and isinstance(value, dict):
            _check_keys(value, table, f"{name}.")
            for inner, inner_value in value.items():
                nested = NESTED.get(f"{name}.{inner}")
                if nested is not None and isinstance(inner_value, dict):
                    _check_keys(inner_value, nested, f"{name}.{inner}.")
    for path, choices in ENUMS.items():
        found: Any = values
        for part in path.split("."):
            found = found.get(part) if isinstance(found, dict) else None
        if found is not None and found not in choices:
            raise KitUsageError(f"{path} is {found!r}, which TensorRT-LLM 1.2 does not accept; use one of "
                                f"{', '.join(choices)}.")


def _check_keys(values: dict[str, Any], table: Fields, prefix: str) -> None:
    for key in values:
        if key not in table:
            near = difflib.get_close_matches(key, list(table), n=1, cutoff=0.5)
            hint = f"did you mean {prefix}{near[0]}?" if near else f"valid keys: {', '.join(sorted(table))}."
            raise KitUsageError(f"{prefix}{key} is not a TensorRT-LLM 1.2 TorchLlmArgs field (LLM() would refuse "
                                f"it at start-up); {hint}")


def render_table() -> str:
    """docs/llmapi-llm-args.md: every field of the table, by section."""
    lines = ["# TorchLlmArgs fields (TensorRT-LLM 1.2.x)", "",
             "Generated from `trtllm_kit/llmapi/llm_args.py` (`python -m trtllm_kit.llmapi.llm_args`); the kit refuses "
             "any `model.yaml` or `extra_llm_api_options.yaml` key not listed here. Source: see "
             "docs/llmapi-confirmed.md.", ""]
    sections = [("TorchLlmArgs (top level)", TORCH_LLM_ARGS), *((f"`{name}`", table) for name, table in NESTED.items()),
                ("`model.yaml` only (Triton llmapi model)", TRITON_ONLY), ("`triton_config`", TRITON_CONFIG)]
    for title, table in sections:
        lines += [f"## {title}", "", "| field | type / default |", "|---|---|"]
        lines += [f"| `{name}` | {kind.replace('|', '&#124;')} |" for name, kind in table.items()]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(render_table(), end="")
