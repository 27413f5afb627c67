"""The ``trtllm-build`` command: the 1.2.x flag table, the kit's fusion and plugin recipe, and the argv.

Recipe (every flag is passed explicitly, because upstream defaults moved between releases):

* plugins: GPT attention plugin and GEMM plugin in the model dtype (``fp8`` GEMMs for FP8 on Hopper+),
  NCCL plugin; context FMHA and paged context FMHA (needed by chunked context and KV reuse);
* packed input (``remove_input_padding``), paged KV cache with ``tokens_per_block``, multiple profiles;
* fused gate/up MLP, except for quantized models other than FP8 (``trtllm-build`` turns it off for them);
* all-reduce fused with the following residual add and norm (``reduce_fusion``) when tp > 1;
* FP8 context FMHA and the FP8 GEMM-SwiGLU plugin for FP8 models on SM 9.0+ (Hopper and newer).

``overrides`` (``--build-flag NAME=VALUE`` or the ``[build.build_flags]`` table) replace any recipe value;
they must name a 1.2.x flag with a valid value.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping as MappingABC
from dataclasses import dataclass
from pathlib import Path

from trtllm_kit.build.gpus import GPU
from trtllm_kit.build.plan import BuildPlan
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
}
# store-true switches of 1.2.x (present or absent, no value)
SWITCHES_1_2 = ("gather_context_logits", "gather_generation_logits", "gather_all_token_logits", "strip_plan",
                "weight_sparsity", "weight_streaming", "fast_build", "dry_run", "monitor_memory",
                "enable_debug_output")
FUSED_MLP_QUANT = (None, "FP8", "MIXED_PRECISION")
OWN_FLAGS = {"checkpoint_dir": "the build", "output_dir": "the build", "max_batch_size": "--max-batch-size",
             "max_input_len": "--max-input-len", "max_seq_len": "--max-seq-len", "max_num_tokens": "--max-num-tokens",
             "tokens_per_block": "--tokens-per-block", "workers": "the number of GPUs"}


@dataclass(frozen=True)
class BuildCommand:
    """One ``trtllm-build`` invocation: the flags in order, and the argv."""

    flags: tuple[tuple[str, str], ...]
    switches: tuple[str, ...] = ()  # store-true flags (``SWITCHES_1_2``), after the valued ones

    @property
    def argv(self) -> list[str]:
        return ["trtllm-build", *(part for name, value in self.flags for part in (f"--{name}", value)),
                *(f"--{name}" for name in self.switches)]

    @property
    def line(self) -> str:
        return shlex.join(self.argv)

    def value(self, name: str) -> str:
        return dict(self.flags)[name]


def recipe(plan: BuildPlan, gpu: GPU) -> dict[str, str]:
    """The kit's plugin and fusion settings for a plan's precision and layout on ``gpu``.

    Arguments:
        plan: the settled memory plan (precision, tp, tokens_per_block).
        gpu: the GPU the engine is built on (decides the Hopper-only FP8 kernels).
    """
    quant = plan.precision.quant_algo
    fp8_hopper = quant == "FP8" and gpu.is_hopper_or_newer
    return {
        "gpt_attention_plugin": "auto",
        "gemm_plugin": "fp8" if fp8_hopper else "auto",
        "nccl_plugin": "auto",
        "context_fmha": "enable",
        "use_paged_context_fmha": "enable",
        "use_fp8_context_fmha": _toggle(fp8_hopper),
        "remove_input_padding": "enable",
        "kv_cache_type": "paged",
        "tokens_per_block": str(plan.tokens_per_block),
        "use_fused_mlp": _toggle(quant in FUSED_MLP_QUANT),
        "gemm_swiglu_plugin": "fp8" if fp8_hopper else "disable",
        "low_latency_gemm_plugin": "disable",
        "reduce_fusion": _toggle(plan.tp_size > 1),
        "user_buffer": "disable",
        "norm_quant_fusion": "disable",
        "multiple_profiles": "enable",
        "streamingllm": "disable",
        "pp_reduce_scatter": "disable",
    }


def _toggle(on: bool) -> str:
    return "enable" if on else "disable"


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


def build_command(plan: BuildPlan, gpu: GPU, checkpoint_dir: Path, output_dir: Path, *, workers: int,
                  timing_cache: Path | None = None, overrides: MappingABC[str, str] | None = None) -> BuildCommand:
    """The full ``trtllm-build`` flag list for a checkpoint, every value explicit.

    Arguments:
        plan: the settled plan (limits, precision, layout).
        gpu: the build GPU.
        checkpoint_dir: the TensorRT-LLM checkpoint.
        output_dir: where the engines go.
        workers: ranks built in parallel (at most the number of GPUs).
        timing_cache: the TensorRT timing cache to read (when it exists) and write.
        overrides: ``{flag: value}`` replacing recipe or limit values.
    """
    flags: dict[str, str] = {
        "checkpoint_dir": str(checkpoint_dir),
        "output_dir": str(output_dir),
        "max_batch_size": str(plan.max_batch_size),
        "max_input_len": str(plan.max_input_len),
        "max_seq_len": str(plan.max_seq_len),
        "max_num_tokens": str(plan.max_num_tokens),
        "max_beam_width": "1",
        "logits_dtype": "float32",
        **recipe(plan, gpu),
        "profiling_verbosity": "layer_names_only",
        "workers": str(workers),
        "log_level": "info",
    }
    if timing_cache is not None:
        if timing_cache.is_file():
            flags["input_timing_cache"] = str(timing_cache)
        flags["output_timing_cache"] = str(timing_cache)
    check_overrides(overrides or {})
    for name, value in (overrides or {}).items():
        flags[name] = str(value)
    for name, value in flags.items():
        check_flag(name, value)
    check_combinations(flags)
    return BuildCommand(tuple(flags.items()), ("gather_context_logits",) if plan.context_logits else ())


def check_combinations(flags: MappingABC[str, str]) -> None:
    """Refuse flag combinations trtllm-build 1.2 rejects after loading the checkpoint (minutes in).

    ``--opt_num_tokens`` is never passed by the recipe for this reason: 1.2 raises when it is set together
    with ``--multiple_profiles enable``.

    Arguments:
        flags: the full flag set.
    """
    rules = [
        (flags.get("multiple_profiles") == "enable" and "opt_num_tokens" in flags,
         "opt_num_tokens cannot be set with multiple_profiles enable; add --build-flag multiple_profiles=disable"),
        (flags.get("user_buffer") == "enable" and flags.get("reduce_fusion") != "enable",
         "user_buffer enable needs reduce_fusion enable"),
        (flags.get("streamingllm") == "enable", "streamingllm is no longer supported by trtllm-build 1.2"),
        (flags.get("pp_reduce_scatter") == "enable", "pp_reduce_scatter is supported for Mixtral only"),
    ]
    for broken, why in rules:
        if broken:
            raise KitUsageError(f"these trtllm-build flags would fail the build: {why}.")


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
