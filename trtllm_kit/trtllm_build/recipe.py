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

from trtllm_kit.errors import KitUsageError
from trtllm_kit.gpus import GPU
from trtllm_kit.plan import BuildPlan
from trtllm_kit.spec.build_flags import check_flag, check_list_flag, check_overrides
from trtllm_kit.spec.speculative import SpeculativeOptions
from trtllm_kit.spec.speculative_support import engine_flags

FUSED_MLP_QUANT = (None, "FP8", "MIXED_PRECISION")
@dataclass(frozen=True)
class BuildCommand:
    """One ``trtllm-build`` invocation: the flags in order, and the argv."""

    flags: tuple[tuple[str, str], ...]
    switches: tuple[str, ...] = ()  # store-true flags (``SWITCHES_1_2``), after the valued ones
    lists: tuple[tuple[str, tuple[str, ...]], ...] = ()  # flags of several values (``LIST_FLAGS_1_2``), before those

    @property
    def argv(self) -> list[str]:
        return ["trtllm-build", *(part for name, value in self.flags for part in (f"--{name}", value)),
                *(part for name, values in self.lists for part in (f"--{name}", *values)),
                *(f"--{name}" for name in self.switches)]

    @property
    def line(self) -> str:
        return shlex.join(self.argv)

    def value(self, name: str) -> str:
        return dict(self.flags)[name]


@dataclass(frozen=True)
class LoraPlugin:
    """The LoRA plugin an engine is built with: its dtype (the model's, which the adapters' weights must have),
    TensorRT-LLM's names of the modules adapters may target, and the highest adapter rank."""

    dtype: str
    target_modules: tuple[str, ...]
    max_lora_rank: int


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


def build_command(plan: BuildPlan, gpu: GPU, checkpoint_dir: Path, output_dir: Path, *, workers: int,
                  timing_cache: Path | None = None, overrides: MappingABC[str, str] | None = None,
                  lora: LoraPlugin | None = None, speculative: SpeculativeOptions | None = None,
                  generation_logits: bool = False) -> BuildCommand:
    """The full ``trtllm-build`` flag list for a checkpoint, every value explicit.

    Arguments:
        plan: the settled plan (limits, precision, layout).
        gpu: the build GPU.
        checkpoint_dir: the TensorRT-LLM checkpoint.
        output_dir: where the engines go.
        workers: ranks built in parallel (at most the number of GPUs).
        timing_cache: the TensorRT timing cache to read (when it exists) and write.
        overrides: ``{flag: value}`` replacing recipe or limit values.
        lora: the LoRA plugin (``--lora_plugin``, ``--max_lora_rank``, ``--lora_target_modules``), or none.
        speculative: the ``[speculative]`` table (``--speculative_decoding_mode``, ``--max_draft_len``), or none.
        generation_logits: ``--gather_generation_logits`` (a draft engine whose logits the target accepts on).
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
        **({"lora_plugin": lora.dtype, "max_lora_rank": str(lora.max_lora_rank)} if lora else {}),
        **(engine_flags(speculative) if speculative is not None else {}),
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
    lists = (("lora_target_modules", lora.target_modules),) if lora else ()
    for name, values in lists:
        check_list_flag(name, values)
    switches = (*(("gather_context_logits",) if plan.context_logits else ()),
                *(("gather_generation_logits",) if generation_logits else ()))
    return BuildCommand(tuple(flags.items()), switches, lists)


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
