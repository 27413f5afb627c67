"""Target ``cpu``: no compile; the kit's CPU runtime serves the ``tensorrt_llm`` slot over ``checkpoint/`` with
the C++ backend's tensors, in-flight batching and a paged KV cache. For development, CI and verification."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_kit.artifact import Artifact, EngineLimits, EngineRecord
from trtllm_kit.artifact.machine import Machine
from trtllm_kit.defaults import DEFAULT_TOKENS_PER_BLOCK
from trtllm_kit.jsonfile import read_json
from trtllm_kit.mapping import Mapping
from trtllm_kit.model_repo.model_dir_limits import (
    CPU_MAX_BATCH_SIZE,
    CPU_MAX_NUM_TOKENS,
    CPU_MAX_SEQ_LEN,
)
from trtllm_kit.names import CHECKPOINT_DIR
from trtllm_kit.spec import BuildSpec
from trtllm_kit.spec.speculative import Speculation
from trtllm_kit.targets.base import BuildContext, EngineSetup, StartupTerms, Target
from trtllm_kit.targets.checkpoint_stage import trtllm_checkpoint_stage
from trtllm_kit.targets.engine_draft import convert_draft, draft_engine_problem

if TYPE_CHECKING:
    from trtllm_kit.model_repo.lora import LoraServing


class CpuTarget(Target):
    name = "cpu"
    summary = "the kit's CPU runtime in the tensorrt_llm slot, over the TensorRT-LLM checkpoint (no GPU)"
    model_dir = CHECKPOINT_DIR
    rank_file_pattern = "rank*.safetensors"
    uses_gpus = False
    backend = "python"
    compiles = False
    slot_model = "tensorrt_llm_cpu.py"
    startup_terms = StartupTerms(runtime_init_s=60, kv_alloc_s=0, cuda_graphs_s=0)

    def machine_problem(self, machine: Machine) -> str | None:
        return None

    def chosen_because(self, machine: Machine) -> str:
        return "no engine compile; the CPU runtime reads checkpoint/"

    def write_checkpoint(self, ctx: BuildContext) -> None:
        """The TensorRT-LLM checkpoint (``checkpoint/``) and ``tokenizer/``."""
        trtllm_checkpoint_stage(ctx)

    def compile(self, ctx: BuildContext, setup: EngineSetup) -> EngineRecord:
        """Nothing to compile: record the reason and the command the engine target would run. With draft-target
        speculation the draft is converted whole into ``draft_checkpoint/``, in the checkpoint's dtype, for the
        ``tensorrt_llm_draft`` slot."""
        options, checkpoint = ctx.spec.speculative, ctx.records.checkpoint
        draft = None
        if options.mode is Speculation.DRAFT_TARGET and options.draft_model is not None:
            assert checkpoint is not None, "the checkpoint stage runs (or is reused) before the compile stage"
            draft = convert_draft(ctx, options.draft_model, checkpoint.dtype)
        return EngineRecord(target=self.name, reason=setup.reason,
                            command=setup.command.argv if setup.command else None,
                            plan=setup.plan, draft=draft)

    def reads_model_dir(self, config: dict[str, Any]) -> bool:
        return "architecture" in config and "build_config" not in config

    def limits(self, model_dir: Path, overrides: dict[str, int | None]) -> EngineLimits:
        """The given sizes, else defaults sized for a CPU, over the checkpoint's ``config.json``."""
        config = read_json(model_dir / "config.json", f"{model_dir}/config.json does not exist; build the "
                           "checkpoint first (trtllm-kit build).")
        mapping = Mapping.from_dict(config.get("mapping") or {}, f"{model_dir}/config.json")
        positions = int(config.get("max_position_embeddings") or CPU_MAX_SEQ_LEN)
        return EngineLimits(
            target=self.name, model_dir=model_dir, rank_file_pattern=self.rank_file_pattern,
            slot_model=self.slot_model,
            max_batch_size=overrides.get("max_batch_size") or CPU_MAX_BATCH_SIZE,
            max_num_tokens=overrides.get("max_num_tokens") or CPU_MAX_NUM_TOKENS,
            max_seq_len=overrides.get("max_seq_len") or min(positions, CPU_MAX_SEQ_LEN), max_beam_width=1,
            tokens_per_block=overrides.get("tokens_per_block") or DEFAULT_TOKENS_PER_BLOCK, use_paged_context_fmha=True,
            tp_size=mapping.tp_size, pp_size=mapping.pp_size,
            vocab_size=config.get("vocab_size"))

    def serve_problems(self, artifact: Artifact, machine: Machine | None) -> list[str]:
        draft = draft_engine_problem(artifact)
        return [draft] if draft else []

    def lora_serving(self, model_dir: Path, spec: BuildSpec) -> LoraServing:
        """Every cpu artifact takes adapters (``lora add`` after the build too), up to ``[build] max_lora_rank``, with
        weights in the checkpoint's dtype."""
        from trtllm_kit.model_repo.lora import LoraServing

        config = read_json(model_dir / "config.json", f"{model_dir}/config.json does not exist; build the checkpoint "
                           "first (trtllm-kit build).")
        return LoraServing.of_dtype(spec.build.max_lora_rank, str(config.get("dtype", "float32")))
