"""Target ``engine``: TensorRT-LLM 1.2.x engines built by ``trtllm-build`` and served by Triton's C++
``tensorrtllm`` backend, one ``tritonserver`` per rank under ``mpirun`` (leader mode). GPU only; planned anywhere."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_kit.artifact import Artifact, EngineBuild, EngineLimits, EngineRecord
from trtllm_kit.artifact.machine import Machine, compatibility, detect_machine, engine_problem
from trtllm_kit.defaults import DEFAULT_TOKENS_PER_BLOCK
from trtllm_kit.enums import GroupLaunch
from trtllm_kit.errors import KitError
from trtllm_kit.names import ENGINE_DIR
from trtllm_kit.spec import BuildSpec
from trtllm_kit.targets.base import BuildContext, EngineSetup, StartupTerms, Target
from trtllm_kit.targets.checkpoint_stage import trtllm_checkpoint_stage
from trtllm_kit.targets.engine_draft import build_draft_engine, draft_engine_problem
from trtllm_kit.trtllm_build.compile import effective_settings, run_trtllm_build
from trtllm_kit.trtllm_build.config_file import read_engine_config

if TYPE_CHECKING:
    from trtllm_kit.model_repo.lora import LoraServing


class EngineTarget(Target):
    name = "engine"
    summary = "TensorRT-LLM 1.2.x engines (trtllm-build) in Triton's C++ tensorrtllm backend, mpirun per rank"
    model_dir = ENGINE_DIR
    rank_file_pattern = "rank*.engine"
    process_per_rank = True
    backend = "tensorrtllm"
    compiles = True
    slot_model = None
    group_launch = GroupLaunch.TRITON_RANKS
    startup_terms = StartupTerms(runtime_init_s=120, kv_alloc_s=60, cuda_graphs_s=0)

    def machine_problem(self, machine: Machine) -> str | None:
        return engine_problem(machine)

    def chosen_because(self, machine: Machine) -> str:
        return (f"tensorrt_llm {machine.tensorrt_llm} and {len(machine.gpus)} GPU(s) ({machine.gpus[0].name}) "
                "found")

    def write_checkpoint(self, ctx: BuildContext) -> None:
        """The TensorRT-LLM checkpoint (``checkpoint/``) and ``tokenizer/``."""
        trtllm_checkpoint_stage(ctx)

    def compile(self, ctx: BuildContext, setup: EngineSetup) -> EngineRecord:
        """``trtllm-build`` over the staged checkpoint into ``engines/`` (logs in ``logs/``)."""
        from trtllm_kit.spec.heads_reader import read_heads  # safetensors headers: torch

        if setup.command is None or setup.plan is None or setup.build_gpu is None:
            raise KitError("target engine has no build plan: this machine's GPU could not be read; pass --gpu NAME "
                           "or --gpu-memory GiB.")
        ctx.reporter.note(f"engine: {setup.command.line}")
        timing_cache = dict(setup.command.flags).get("output_timing_cache")
        if timing_cache:
            Path(timing_cache).parent.mkdir(parents=True, exist_ok=True)
        layout, machine = ctx.mapping, setup.machine
        result = run_trtllm_build(setup.command, ctx.out, ctx.out / "logs", layout.world_size)
        built = EngineBuild(
            dir=ENGINE_DIR, world_size=layout.world_size, tp_size=layout.tp_size, pp_size=layout.pp_size,
            tensorrt_llm=machine.tensorrt_llm, tensorrt=machine.tensorrt, cuda=machine.cuda, driver=machine.driver,
            gpu=setup.build_gpu.name, compute_capability=setup.build_gpu.sm,
            effective=effective_settings(result.engine_config), compile_seconds=round(result.seconds, 3))
        draft, heads = setup.draft, read_heads(ctx.spec.speculative, ctx.model.hf)
        return EngineRecord(target=self.name, reason=setup.reason, command=setup.command.argv,
                            plan=setup.plan, built=built, draft_command=draft.command.argv if draft else None,
                            draft=build_draft_engine(ctx, setup, draft) if draft else None,
                            heads=heads.record() if heads else None)

    def reads_model_dir(self, config: dict[str, Any]) -> bool:
        return "build_config" in config or "builder_config" in config

    def limits(self, model_dir: Path, overrides: dict[str, int | None]) -> EngineLimits:
        """Read a TensorRT-LLM 1.x engine ``config.json`` (``pretrained_config`` + ``build_config``); the engine
        fixes its sizes, so ``overrides`` do not apply."""
        config = read_engine_config(model_dir, f"{model_dir}/config.json does not exist; build the engine first "
                                    "(trtllm-kit build).")
        build, plugin, mapping = config.build, config.plugin, config.mapping
        return EngineLimits(
            target=self.name, model_dir=model_dir, rank_file_pattern=self.rank_file_pattern,
            slot_model=self.slot_model, max_batch_size=int(build["max_batch_size"]),
            max_num_tokens=int(build.get("max_num_tokens") or 8192), max_seq_len=int(build["max_seq_len"]),
            max_beam_width=int(build.get("max_beam_width", 1)),
            tokens_per_block=int(plugin.get("tokens_per_block", DEFAULT_TOKENS_PER_BLOCK)),
            use_paged_context_fmha=_enabled(plugin.get("use_paged_context_fmha", False)),
            tp_size=mapping.tp_size, pp_size=mapping.pp_size, vocab_size=config.pretrained.get("vocab_size"))

    def lora_serving(self, model_dir: Path, spec: BuildSpec) -> LoraServing | None:
        """An engine built with the LoRA plugin takes adapters up to its ``max_lora_rank``, with weights in the
        engine's dtype (the backend refuses another); without the plugin it takes none."""
        from trtllm_kit.model_repo.lora import LoraServing

        config = read_engine_config(model_dir, f"{model_dir}/config.json does not exist; build the engine first "
                                    "(trtllm-kit build).")
        plugin = config.plugin.get("lora_plugin")
        if not plugin or str(plugin).lower() == "disable":
            return None
        rank = (config.build.get("lora_config") or {}).get("max_lora_rank") or spec.build.max_lora_rank
        return LoraServing.of_dtype(int(rank), str(config.pretrained.get("dtype", "float16")))

    def serve_problems(self, artifact: Artifact, machine: Machine | None) -> list[str]:
        draft = draft_engine_problem(artifact)
        return [*compatibility(artifact, machine or detect_machine()), *([draft] if draft else [])]


def _enabled(value: Any) -> bool:
    """A plugin switch as engines record it: a bool, or the ``enable``/``disable`` spelling of the CLI."""
    return value.strip().lower() in ("enable", "true", "1") if isinstance(value, str) else bool(value)
