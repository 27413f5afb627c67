"""Target ``llmapi``: TensorRT-LLM's PyTorch backend (1.0 and later, including 1.2.1 and every release after the
TensorRT engine path was removed). The artifact is an unsharded unified HF checkpoint, ``model.yaml`` of
``TorchLlmArgs`` fields, one Triton ``tensorrt_llm`` Python model with upstream's ``llmapi`` interface, and a
``trtllm-serve`` configuration. TP/PP happen inside the ``LLM`` at load time: one server process."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_kit.artifact import CheckpointRecord, EngineLimits, EngineRecord, LoraRecord, RepoRecord
from trtllm_kit.artifact.machine import Machine
from trtllm_kit.defaults import DEFAULT_TOKENS_PER_BLOCK
from trtllm_kit.enums import GroupLaunch
from trtllm_kit.errors import KitUsageError
from trtllm_kit.gpus import GPU
from trtllm_kit.jsonfile import read_json
from trtllm_kit.llmapi.plan_report import llmapi_plan
from trtllm_kit.model_repo.model_dir_limits import (
    CPU_MAX_BATCH_SIZE,
    CPU_MAX_NUM_TOKENS,
    CPU_MAX_SEQ_LEN,
)
from trtllm_kit.models.base import Family
from trtllm_kit.models.hf_config import HFConfig
from trtllm_kit.names import CHECKPOINT_DIR, DRAFT_DIR
from trtllm_kit.precision import Precision
from trtllm_kit.spec import BuildSpec
from trtllm_kit.spec.gpu_groups import check_gpu_groups, parse_gpu_device_ids
from trtllm_kit.targets.base import BuildContext, EngineSetup, StartupTerms, Target
from trtllm_kit.targets.checkpoint_stage import calibration_stats, copy_tokenizer, run_verify, should_verify

if TYPE_CHECKING:  # the format check imports torch; the target registry stays torch-free for a fast CLI start
    from trtllm_kit.quant.prequantized import PreQuantized


class LlmapiTarget(Target):
    name = "llmapi"
    summary = "TensorRT-LLM's PyTorch backend: unified HF checkpoint, Triton llmapi Python model, trtllm-serve"
    model_dir = CHECKPOINT_DIR
    rank_file_pattern = "model-*.safetensors"
    backend = "python"
    compiles = False
    slot_model = "tensorrt_llm_llmapi.py"
    group_launch = GroupLaunch.LLMAPI_LAUNCH
    startup_terms = StartupTerms(runtime_init_s=180, kv_alloc_s=60, cuda_graphs_s=300)
    text_models = ("tensorrt_llm",)
    owns_checkpoint = True

    def machine_problem(self, machine: Machine) -> str | None:
        return None  # builds anywhere; on a CPU the repository's model runs the kit's CPU runtime

    def chosen_because(self, machine: Machine) -> str:
        if machine.tensorrt_llm:
            return f"tensorrt_llm {machine.tensorrt_llm} found; the PyTorch backend loads checkpoint/ at start-up"
        return "no compile; the PyTorch backend (or, on a CPU, the kit's CPU runtime) loads checkpoint/ at start-up"

    def check_spec(self, spec: BuildSpec) -> None:
        """Refuse the quantizations the PyTorch backend cannot load (int8-sq, int8-wo, an INT8 KV cache) and GPU
        groups (``--gpu-device-ids``) that do not hold tp x pp distinct GPUs each."""
        from trtllm_kit.llmapi.quant_format import check_llmapi_quant  # torch
        check_llmapi_quant(spec.quant_config())
        if spec.repo.gpu_device_ids is not None:
            check_gpu_groups(parse_gpu_device_ids(spec.repo.gpu_device_ids), spec.build.tp, spec.build.pp)

    def write_checkpoint(self, ctx: BuildContext) -> None:
        """The unified HF checkpoint (calibrated for FP8), the tokenizer, and a CPU verify for small models."""
        from trtllm_kit.llmapi.quant_format import hf_quant_config  # torch
        from trtllm_kit.llmapi.unified import write_unified  # torch
        from trtllm_kit.quant.prequantized import detect_prequantized  # torch

        quant = ctx.spec.quant_config()
        ckpt_dir = ctx.out / CHECKPOINT_DIR
        fmt = detect_prequantized(ctx.model.path)
        if fmt is not None:
            self._copy_prequantized(ctx, fmt)
            self._copy_draft(ctx)
            return
        stats = calibration_stats(ctx)
        ckpt_dir.mkdir()
        with ctx.reporter.task("export", ctx.model.weight_bytes) as advance:
            result = write_unified(ctx.model, ckpt_dir, ctx.spec.build.dtype, quant, stats, lambda _n, b: advance(b))
        copy_tokenizer(ctx.model, ctx.out / "tokenizer")
        ctx.records.checkpoint = CheckpointRecord(
            dir=CHECKPOINT_DIR, dtype=result.dtype, **ctx.mapping.to_dict(),
            quantization=hf_quant_config(quant)["quantization"] if quant.is_quantized else None)
        if should_verify(ctx.spec, ctx.model):
            from trtllm_kit.llmapi.load import load_unified  # torch

            t0 = time.perf_counter()
            ctx.records.verify = run_verify(ckpt_dir, ctx.model, ctx.reporter,
                                            load=lambda dtype: load_unified(ckpt_dir, ctx.mapping, dtype))
            ctx.timings["verify"] = time.perf_counter() - t0
        self._copy_draft(ctx)

    def _copy_draft(self, ctx: BuildContext) -> None:
        """The draft (draft-target) or the EAGLE3 heads into ``draft/``, recorded relative to the artifact: the
        ``speculative_model_dir`` the recipe writes names this copy, which moves with the artifact."""
        from trtllm_kit.llmapi.draft_copy import copy_draft

        source = ctx.spec.speculative.draft_model
        if source is None:
            return
        copied = copy_draft(source, ctx.out / DRAFT_DIR)
        ctx.reporter.note(f"draft: {source} copied into {DRAFT_DIR}/ ({copied / 1e6:.1f} MB)")
        ctx.records.draft = {"dir": DRAFT_DIR, "source": str(source), "bytes": copied}

    def _copy_prequantized(self, ctx: BuildContext, fmt: PreQuantized) -> None:
        """A pre-quantized input is the checkpoint as it is: checked, copied, not verified against transformers
        (which cannot load every such format; the bytes are the input's)."""
        from trtllm_kit.llmapi.passthrough import copy_prequantized  # torch

        if ctx.spec.quant_config().is_quantized:
            raise KitUsageError(f"{ctx.model.source} is already quantized ({fmt.label}, {fmt.declared_in}); the "
                                "llmapi target serves it as it is: drop --quant and --kv-cache.")
        ckpt_dir = ctx.out / CHECKPOINT_DIR
        ckpt_dir.mkdir()
        ctx.reporter.note(f"export: {fmt.label} input ({fmt.declared_in}): copied as it is")
        with ctx.reporter.task("export", ctx.model.weight_bytes) as advance:
            result = copy_prequantized(ctx.model, ckpt_dir, fmt)
            advance(result.bytes_read)
        copy_tokenizer(ctx.model, ctx.out / "tokenizer")
        ctx.records.checkpoint = CheckpointRecord(
            dir=CHECKPOINT_DIR, dtype=result.dtype, **ctx.mapping.to_dict(),
            quantization={"quant_algo": fmt.quant_algo, "kv_cache_quant_algo": fmt.kv_cache_quant_algo,
                          "input": fmt.label})

    def compile(self, ctx: BuildContext, setup: EngineSetup) -> EngineRecord:
        """Nothing to compile: write the ``trtllm-serve`` configuration and record its command line."""
        from trtllm_kit.targets.llmapi_repo import write_serve_config  # tritonclient's protobufs

        command = write_serve_config(ctx, setup)
        return EngineRecord(target=self.name, reason=setup.reason, command=command,
                            plan=setup.plan)

    def own_plan(self, spec: BuildSpec, hf: HFConfig, family: Family, precision: Precision,
                 gpu: GPU | None, lora: LoraRecord | None = None) -> dict[str, Any] | None:
        """No engine: the PyTorch backend's recipe, memory per rank and serve command."""
        return llmapi_plan(spec, hf, family, precision, gpu, lora)

    def reads_model_dir(self, config: dict[str, Any]) -> bool:
        return isinstance(config.get("architectures"), list) and "model_type" in config

    def limits(self, model_dir: Path, overrides: dict[str, int | None]) -> EngineLimits:
        """The given sizes, else the CPU runtime's defaults, over the unified checkpoint's HF ``config.json``."""
        config = read_json(model_dir / "config.json", f"{model_dir}/config.json does not exist; build the "
                           "checkpoint first (trtllm-kit build --target llmapi).")
        positions = int(config.get("max_position_embeddings") or CPU_MAX_SEQ_LEN)
        return EngineLimits(
            target=self.name, model_dir=model_dir, rank_file_pattern=self.rank_file_pattern,
            slot_model=self.slot_model,
            max_batch_size=overrides.get("max_batch_size") or CPU_MAX_BATCH_SIZE,
            max_num_tokens=overrides.get("max_num_tokens") or CPU_MAX_NUM_TOKENS,
            max_seq_len=overrides.get("max_seq_len") or min(positions, CPU_MAX_SEQ_LEN), max_beam_width=1,
            tokens_per_block=overrides.get("tokens_per_block") or DEFAULT_TOKENS_PER_BLOCK, use_paged_context_fmha=True,
            tp_size=int(overrides.get("tp_size") or 1), pp_size=int(overrides.get("pp_size") or 1),
            vocab_size=config.get("vocab_size"))

    def write_repo(self, ctx: BuildContext) -> RepoRecord | None:
        from trtllm_kit.targets.llmapi_repo import llmapi_repo_stage  # tritonclient's protobufs

        return llmapi_repo_stage(ctx, self)
