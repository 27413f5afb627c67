"""The engine target's draft engine for draft-target speculation: the draft's TensorRT-LLM checkpoint
(``draft_checkpoint/``, whole, in the target's dtype) and its ``trtllm-build`` (``draft_engines/``, logs in
``logs/draft/``); ``trtllm_build/draft.py`` settles the command."""

from __future__ import annotations

from pathlib import Path

from trtllm_kit.artifact import Artifact, CheckpointRecord, EngineBuild
from trtllm_kit.mapping import Mapping
from trtllm_kit.names import DRAFT_CHECKPOINT_DIR, DRAFT_ENGINE_DIR
from trtllm_kit.targets.base import BuildContext, EngineSetup
from trtllm_kit.trtllm_build.compile import effective_settings, run_trtllm_build
from trtllm_kit.trtllm_build.draft import DRAFT_WORLD_SIZE, DraftBuild

DRAFT_LOG_DIR = "logs/draft"


def build_draft_engine(ctx: BuildContext, setup: EngineSetup, draft: DraftBuild) -> EngineBuild:
    """Convert the draft model and build its engine in the staging directory; returns what was built.

    Arguments:
        ctx: the build; setup: the settled engine stage (its GPU and machine); draft: the draft's build.
    """
    assert setup.build_gpu is not None, "a draft build is settled only with a build GPU"
    convert_draft(ctx, draft.source, draft.dtype)
    ctx.reporter.note(f"draft engine: {draft.command.line}")
    result = run_trtllm_build(draft.command, ctx.out, ctx.out / DRAFT_LOG_DIR, DRAFT_WORLD_SIZE)
    machine = setup.machine
    return EngineBuild(dir=DRAFT_ENGINE_DIR, world_size=DRAFT_WORLD_SIZE, tp_size=DRAFT_WORLD_SIZE, pp_size=1,
                       tensorrt_llm=machine.tensorrt_llm, tensorrt=machine.tensorrt, cuda=machine.cuda,
                       driver=machine.driver, gpu=setup.build_gpu.name, compute_capability=setup.build_gpu.sm,
                       effective=effective_settings(result.engine_config), compile_seconds=round(result.seconds, 3))


def convert_draft(ctx: BuildContext, source: Path, dtype: str) -> CheckpointRecord:
    """Convert the draft model whole (``draft_checkpoint/``, one rank, unquantized in ``dtype``); returns its record.

    Arguments:
        ctx: the build; source: the draft's HF directory (--draft-model); dtype: the target's dtype.
    """
    from trtllm_kit.checkpoint.convert import convert  # torch
    from trtllm_kit.models.inspect import inspect_model  # torch

    model = inspect_model(str(source), allow_pickle=ctx.spec.build.allow_pickle)
    ckpt_dir = ctx.out / DRAFT_CHECKPOINT_DIR
    ckpt_dir.mkdir()
    with ctx.reporter.task("convert draft", model.weight_bytes) as advance:
        convert(model, ckpt_dir, Mapping(DRAFT_WORLD_SIZE, 1), dtype, lambda _name, n: advance(n))
    return CheckpointRecord(dir=DRAFT_CHECKPOINT_DIR, dtype=dtype, world_size=DRAFT_WORLD_SIZE,
                            tp_size=DRAFT_WORLD_SIZE, pp_size=1)


def draft_engine_problem(artifact: Artifact) -> str | None:
    """Why the draft a draft-target artifact records cannot be served (its directory lacks ``config.json`` or a rank's
    file: an engine, or the cpu target's checkpoint rank), or None (no draft, or a whole one).

    Arguments:
        artifact: the artifact to serve.
    """
    engine = artifact.records.engine
    draft = engine.draft if engine is not None else None
    if draft is None:
        return None
    engine_dir = artifact.path / draft.dir
    kind, suffix = ("checkpoint", "safetensors") if isinstance(draft, CheckpointRecord) else ("engine", "engine")
    wanted = ["config.json", *(f"rank{rank}.{suffix}" for rank in range(draft.world_size))]
    missing = [name for name in wanted if not (engine_dir / name).is_file()]
    if not missing:
        return None
    return f"its draft {kind} {draft.dir}/ lacks {', '.join(missing)}, which draft-target speculation serves"
