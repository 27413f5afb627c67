"""The flags of ``trtllm-build`` 1.2.x the kit knows, and the check of ``--build-flag NAME=VALUE`` overrides
(or the ``[build.build_flags]`` table) against them: part of validating a build spec."""

from __future__ import annotations

from collections.abc import Mapping as MappingABC

from trtllm_kit.errors import KitUsageError

TOGGLE = ("enable", "disable")
PLUGIN_DTYPES = ("auto", "float16", "bfloat16", "float32", "int32", "disable")
INT = "<int>"
PATH = "<path>"
# trtllm-build 1.2.x: flag → accepted values (INT / PATH for free values), from the tables of
# docs/trtllm-checkpoint.md §7.2
FLAGS_1_2: dict[str, tuple[str, ...]] = {
    "checkpoint_dir": (PATH,), "model_config": (PATH,), "build_config": (PATH,), "output_dir": (PATH,),
    "max_batch_size": (INT,), "max_input_len": (INT,), "max_seq_len": (INT,), "max_num_tokens": (INT,),
    "opt_num_tokens": (INT,), "max_beam_width": (INT,), "max_encoder_input_len": (INT,),
    "max_prompt_embedding_table_size": (INT,), "max_multimodal_len": (INT,),
    "kv_cache_type": ("continuous", "paged", "disabled"), "logits_dtype": ("float16", "float32"),
    "profiling_verbosity": ("layer_names_only", "detailed", "none"),
    "input_timing_cache": (PATH,), "output_timing_cache": (PATH,), "max_draft_len": (INT,),
    "lora_dir": (PATH,), "lora_ckpt_source": ("hf", "nemo"), "max_lora_rank": (INT,), "workers": (INT,),
    "log_level": ("internal_error", "error", "warning", "info", "verbose", "debug"),
    "gpt_attention_plugin": PLUGIN_DTYPES, "gemm_plugin": (*PLUGIN_DTYPES, "fp8", "nvfp4"),
    "nccl_plugin": PLUGIN_DTYPES, "moe_plugin": PLUGIN_DTYPES, "mamba_conv1d_plugin": PLUGIN_DTYPES,
    "lora_plugin": PLUGIN_DTYPES, "gemm_swiglu_plugin": ("fp8", "disable"),
    "low_latency_gemm_plugin": ("fp8", "disable"),
    "context_fmha": TOGGLE, "use_paged_context_fmha": TOGGLE, "use_fp8_context_fmha": TOGGLE,
    "remove_input_padding": TOGGLE, "tokens_per_block": (INT,), "use_fused_mlp": TOGGLE, "reduce_fusion": TOGGLE,
    "user_buffer": TOGGLE, "norm_quant_fusion": TOGGLE, "multiple_profiles": TOGGLE, "streamingllm": TOGGLE,
    "pp_reduce_scatter": TOGGLE,
    "speculative_decoding_mode": ("draft_tokens_external", "lookahead_decoding", "medusa", "explicit_draft_tokens",
                                  "eagle"),
}
# flags of several values (argparse nargs="+"): flag → accepted values (LoraManager.LORA_MODULE_IDS' keys)
LIST_FLAGS_1_2: dict[str, tuple[str, ...]] = {
    "lora_target_modules": ("attn_qkv", "attn_q", "attn_k", "attn_v", "attn_dense", "mlp_h_to_4h", "mlp_4h_to_h",
                            "mlp_gate", "cross_attn_qkv", "cross_attn_q", "cross_attn_k", "cross_attn_v",
                            "cross_attn_dense", "moe_h_to_4h", "moe_4h_to_h", "moe_gate", "moe_router", "mlp_router",
                            "mlp_gate_up"),
}
# store-true switches of 1.2.x (present or absent, no value)
SWITCHES_1_2 = ("gather_context_logits", "gather_generation_logits", "gather_all_token_logits", "strip_plan",
                "weight_sparsity", "weight_streaming", "fast_build", "dry_run", "monitor_memory",
                "enable_debug_output")
OWN_FLAGS = {"checkpoint_dir": "the build", "output_dir": "the build", "max_batch_size": "--max-batch-size",
             "max_input_len": "--max-input-len", "max_seq_len": "--max-seq-len", "max_num_tokens": "--max-num-tokens",
             "tokens_per_block": "--tokens-per-block", "workers": "the number of GPUs",
             "speculative_decoding_mode": "--speculative"}


def check_list_flag(name: str, values: tuple[str, ...]) -> None:
    """Refuse an empty value list, or a value a trtllm-build 1.2.x flag of several values does not take.

    Arguments:
        name: the flag without dashes (a ``LIST_FLAGS_1_2`` key); values: its values.
    """
    allowed = LIST_FLAGS_1_2[name]
    wrong = [v for v in values if v not in allowed]
    if not values or wrong:
        raise KitUsageError(f"--{name} takes one or more of {', '.join(allowed)}, got {' '.join(values) or 'none'}.")


def check_flag(name: str, value: str) -> None:
    """Refuse a flag trtllm-build 1.2.x does not have, or a value it does not take.

    Arguments:
        name: the flag without dashes; value: its value.
    """
    allowed = FLAGS_1_2.get(name)
    if allowed is None:
        raise KitUsageError(f"--build-flag {name} is not a trtllm-build 1.2 flag that takes a value; known: "
                            f"{', '.join(sorted(FLAGS_1_2))}.")
    if allowed == (INT,):
        if not value.isdigit():
            raise KitUsageError(f"--build-flag {name}={value} needs a non-negative integer.")
    elif allowed != (PATH,) and value not in allowed:
        raise KitUsageError(f"--build-flag {name}={value} is not one of {', '.join(allowed)}.")


def check_overrides(overrides: MappingABC[str, object]) -> None:
    """Refuse overrides of flags the kit owns (paths, plan limits, workers) and unknown flags or values.

    Arguments:
        overrides: ``{flag: value}`` from ``--build-flag`` or ``[build.build_flags]``.
    """
    for name, value in overrides.items():
        if name in OWN_FLAGS:
            raise KitUsageError(f"--build-flag {name} is set from {OWN_FLAGS[name]} and the memory plan; "
                                "it cannot be overridden.")
        check_flag(name, str(value))


def parse_overrides(pairs: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``["gemm_plugin=disable", ...]`` → ``{"gemm_plugin": "disable"}``, each checked against the flag table.

    Arguments:
        pairs: ``NAME=VALUE`` strings (a leading ``--`` on NAME is accepted).
    """
    result: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        name = name.strip().removeprefix("--")
        if not sep or not name or not value:
            raise KitUsageError(f"--build-flag {pair!r} is not NAME=VALUE (e.g. gemm_plugin=disable).")
        result[name] = value.strip()
    check_overrides(result)
    return result
