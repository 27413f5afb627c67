"""The engine stage: target choice, memory plan, the ``trtllm-build`` command, and the target's compile.

``prepare_compile`` does everything that must happen before heavy work (choose the target, plan memory and
refuse a plan that does not fit, settle the command line); ``compile_stage`` hands the staged checkpoint to the
target's compile step. Target ``cpu`` compiles nothing and records the command the engine target would run.
"""

from __future__ import annotations

import re
from pathlib import Path

from trtllm_kit.artifact.machine import Machine
from trtllm_kit.build_limits import Limits
from trtllm_kit.checkpoint.trtllm_config import precision_of
from trtllm_kit.enums import Target
from trtllm_kit.errors import KitUsageError
from trtllm_kit.gpus import GPU, resolve_gpu
from trtllm_kit.lora.settings import base_config, lora_settings, trtllm_modules
from trtllm_kit.mapping import Mapping
from trtllm_kit.models.base import Family
from trtllm_kit.models.builtin import cache_root
from trtllm_kit.models.hf_config import HFConfig
from trtllm_kit.names import ENGINE_DIR
from trtllm_kit.plan import make_plan
from trtllm_kit.precision import Precision
from trtllm_kit.spec import BuildSpec
from trtllm_kit.spec.build_flags import check_overrides
from trtllm_kit.spec.draft_memory import draft_memory
from trtllm_kit.spec.eagle_heads import check_eagle_layout
from trtllm_kit.spec.heads_reader import check_heads_precision
from trtllm_kit.spec.speculative_support import check_build, mtp_layers
from trtllm_kit.targets import choose_target, get_target
from trtllm_kit.targets.base import BuildContext, EngineSetup
from trtllm_kit.trtllm_build.draft import check_draft_layout, draft_build, draft_precision
from trtllm_kit.trtllm_build.fit import check_plan
from trtllm_kit.trtllm_build.recipe import LoraPlugin, build_command


def prepare_compile(spec: BuildSpec, hf: HFConfig, family: Family, machine: Machine, *,
                   compile_requested: bool, plan_only: bool = False) -> EngineSetup:
    """Choose the target, plan memory (refusing a plan that does not fit) and settle the command.

    Arguments:
        spec: the build spec.
        hf: the model config; family: its weight table.
        machine: ``detect_machine()``.
        compile_requested: the engine stage is among the stages to run.
        plan_only: nothing will run (``plan``, ``build --dry-run``): the target's machine check is reported,
        not enforced, so a CPU machine plans the build a GPU machine will do.
    """
    check_overrides(spec.build.build_flags)
    if compile_requested or (spec.build.target != "auto" and get_target(spec.build.target).owns_checkpoint):
        target, reason = choose_target(spec.build.target, machine, plan_only=plan_only or not compile_requested)
    else:
        target, reason = choose_target("cpu", machine)[0], "engine stage not run"
    # a checkpoint built for a named target (engine --until checkpoint) is checked against that target's needs
    named = get_target(spec.build.target) if spec.build.target != "auto" else target
    named.check_spec(spec)
    check_build(spec.speculative, Target(named.name))
    if named.name == Target.ENGINE:
        check_draft_layout(spec.speculative, spec.build.tp, spec.build.pp)
        check_eagle_layout(spec.speculative, spec.build.tp, spec.build.pp)
    mtp_layers(spec.speculative, hf.raw)
    check_heads_precision(spec.speculative, precision_of(spec, hf))
    gpu = resolve_gpu(spec.build.gpu, spec.build.gpu_memory, list(machine.gpus))
    plan = None
    if gpu is not None:
        b = spec.build
        precision = precision_of(spec, hf)  # the engine target's draft is unquantized (trtllm_build/draft.py)
        drafted = draft_precision(precision) if named.name == Target.ENGINE else precision
        limits = Limits(b.max_batch_size, b.max_input_len, b.max_seq_len, b.max_num_tokens, b.tokens_per_block,
                        b.kv_cache_fraction, b.context_logits,
                        draft_memory(spec.speculative, hf.raw, drafted, spec.build.tp, Target(named.name)))
        plan = make_plan(hf, family, Mapping(spec.build.tp, spec.build.pp), precision_of(spec, hf), gpu, limits)
        if compile_requested:
            check_plan(plan, hf, family)
    build_gpu = machine.gpus[0] if target.compiles and machine.gpus else gpu
    if compile_requested and build_gpu is not None:
        check_fp8(precision_of(spec, hf), build_gpu)
    lora = lora_settings(spec.build, base_config(hf))
    command, draft = None, None
    if plan is not None and build_gpu is not None:
        workers = max(1, min(spec.build.tp * spec.build.pp, len(machine.gpus)))
        plugin = LoraPlugin(precision_of(spec, hf).dtype, tuple(trtllm_modules(lora)), lora.max_lora_rank) \
            if lora is not None else None
        command = build_command(plan, build_gpu, Path("checkpoint"), Path(ENGINE_DIR), workers=workers,
                                timing_cache=timing_cache_path(build_gpu, machine), overrides=spec.build.build_flags,
                                lora=plugin, speculative=spec.speculative if named.name == Target.ENGINE else None)
        if named.name == Target.ENGINE:
            draft = draft_build(spec.speculative, plan, build_gpu, timing_cache=timing_cache_path(build_gpu, machine))
    return EngineSetup(target, reason, plan, build_gpu, command, machine, lora, draft)


def check_fp8(precision: Precision, gpu: GPU) -> None:
    """Refuse FP8 weights or an FP8 KV cache on a GPU older than Ada (SM 8.9).

    Arguments:
        precision: the quantization; gpu: the GPU the engine is for.
    """
    wants = [what for what, algo in (("--quant fp8", precision.quant_algo), ("--kv-cache fp8",
                                                                             precision.kv_cache_quant_algo))
             if algo == "FP8"]
    if wants and gpu.compute_capability is not None and not gpu.has_fp8:
        raise KitUsageError(f"{' and '.join(wants)} need an Ada or Hopper GPU (SM 8.9+), but {gpu.name} is SM "
                            f"{gpu.sm}; use --quant int8-wo or int8-sq and --kv-cache int8, or an FP8-capable GPU.")


def timing_cache_path(gpu: GPU, machine: Machine) -> Path:
    """One TensorRT timing cache per GPU type and TensorRT version, kept in the kit's cache directory."""
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.name.lower()).strip("-")
    return cache_root() / "timing-cache" / f"{slug}-sm{gpu.sm or 'unknown'}-trt{machine.tensorrt or 'none'}.cache"


def compile_stage(ctx: BuildContext) -> None:
    """checkpoint/ → the target's compile step (engines/ with trtllm-build, or a record of the command)."""
    setup = ctx.engine
    assert setup is not None, "run_build prepares the engine stage"
    ctx.records.engine = setup.target.compile(ctx, setup)
