"""The draft engine of draft-target speculation: the draft's checkpoint is converted whole (tp 1, pp 1), unquantized
in the target's dtype, and built with the target's recipe and limits but none of its speculative flags, as
upstream's ``examples/draft_target_model`` builds it (the same ``max_batch_size``, ``max_input_len`` and
``max_seq_len``; ``--max_draft_len`` on the target only). With draft logits the draft gathers its generation logits
(``--gather_generation_logits``), which the target accepts on."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from trtllm_kit.errors import KitUsageError
from trtllm_kit.gpus import GPU
from trtllm_kit.names import DRAFT_CHECKPOINT_DIR, DRAFT_ENGINE_DIR
from trtllm_kit.plan import BuildPlan
from trtllm_kit.precision import Precision
from trtllm_kit.spec.speculative import Speculation, SpeculativeOptions
from trtllm_kit.trtllm_build.recipe import BuildCommand, build_command

DRAFT_WORLD_SIZE = 1  # the draft is whole on every rank (the plan counts its weights and KV on each)


@dataclass(frozen=True)
class DraftBuild:
    """The draft engine a draft-target build makes: the draft model, its dtype and its ``trtllm-build``."""

    source: Path  # the draft's HF directory (--draft-model)
    dtype: str  # the target's resolved dtype
    command: BuildCommand


def draft_precision(target: Precision) -> Precision:
    """The draft's precision: the target's dtype, unquantized (its KV cache too).

    Arguments:
        target: the target checkpoint's precision.
    """
    return Precision(target.dtype)


def check_draft_layout(options: SpeculativeOptions, tp_size: int, pp_size: int) -> None:
    """Refuse draft-target on a sharded target: the engine target serves one ``tritonserver`` per rank (leader
    mode), where the whole draft engine cannot run beside the target's ranks (upstream needs orchestrator mode).

    Arguments:
        options: the ``[speculative]`` table; tp_size, pp_size: the target's layout.
    """
    if options.mode is Speculation.DRAFT_TARGET and tp_size * pp_size > DRAFT_WORLD_SIZE:
        raise KitUsageError(f"--speculative draft-target on the engine target needs --tp 1 --pp 1 (its draft engine "
                            f"runs whole beside a one-rank target), got tp {tp_size} pp {pp_size}; build with --tp 1 "
                            "--pp 1 or with --target llmapi.")


def draft_build(options: SpeculativeOptions, plan: BuildPlan, gpu: GPU, *, timing_cache: Path | None = None
                ) -> DraftBuild | None:
    """The draft engine's build for a draft-target table (None for any other mode).

    Arguments:
        options: the ``[speculative]`` table, checked against the engine target; plan: the target's settled plan;
        gpu: the build GPU; timing_cache: the TensorRT timing cache (the target's: same GPU and TensorRT).
    """
    if options.mode is not Speculation.DRAFT_TARGET or options.draft_model is None:
        return None
    precision = draft_precision(plan.precision)
    draft_plan = replace(plan, precision=precision, tp_size=DRAFT_WORLD_SIZE, pp_size=1, context_logits=False)
    command = build_command(draft_plan, gpu, Path(DRAFT_CHECKPOINT_DIR), Path(DRAFT_ENGINE_DIR),
                            workers=DRAFT_WORLD_SIZE, timing_cache=timing_cache,
                            generation_logits=options.draft_logits)
    return DraftBuild(options.draft_model, precision.dtype, command)
