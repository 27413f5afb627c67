"""The repo stage of a build: the target writes its own repository (llmapi) or the standard models over its
engine or checkpoint directory, validated in place; and what decides the stage's cache key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtllm_kit.artifact.files import sha256_file
from trtllm_kit.errors import KitError
from trtllm_kit.model_repo.configs import SCHEMA
from trtllm_kit.model_repo.repository import PYTHON_MODELS, python_source, write_repository
from trtllm_kit.model_repo.spec_decode import DraftServing
from trtllm_kit.model_repo.validate import Expectation, validate_repository
from trtllm_kit.spec.repo_options import REPO_FIELDS
from trtllm_kit.spec.speculative_support import cpu_parameters, decoding_parameters
from trtllm_kit.targets import TARGETS, get_target, limits_from_dir
from trtllm_kit.targets.base import BuildContext


def repo_key_parts(spec: Any) -> dict[str, Any]:
    """What decides the repository besides the engine: the [repo] options, the CPU runtime's limits, the output
    location (``gpt_model_path`` is absolute) and the shipped Python models.

    Arguments:
        spec: the build spec.
    """
    values = spec.to_dict()
    sources = sorted({f for source, helpers in PYTHON_MODELS.values() for f in (source, *helpers)}
                     | {t.slot_model for t in TARGETS.values() if t.slot_model})
    return {"options": {k: values["repo"][k] for k in REPO_FIELDS},
            "limits": {k: values["build"][k] for k in ("max_batch_size", "max_num_tokens", "max_seq_len",
                                                        "tokens_per_block", "kv_cache_fraction", "max_lora_rank")},
            "speculative": values["speculative"],
            "target": values["build"]["target"], "out": str(Path(values["out"]).absolute()), "schema": SCHEMA,
            "sources": {name: sha256_file(python_source(name)) for name in sources}}


def repo_stage(ctx: BuildContext) -> None:
    """Engine or checkpoint → ``repo/``, validated in place before the build output is moved into position."""
    engine = ctx.records.engine
    assert engine is not None, "the engine stage runs (or is reused) before the repo stage"
    target = get_target(engine.target)
    own = target.write_repo(ctx)  # a target with its own repository layout (llmapi)
    if own is not None:
        ctx.records.repo = own
        return
    build = ctx.spec.build
    sizes: dict[str, int | None] = {
        "max_batch_size": build.max_batch_size, "max_num_tokens": build.max_num_tokens,
        "max_seq_len": build.max_seq_len, "tokens_per_block": build.tokens_per_block}
    limits = target.limits(ctx.out / target.model_dir, sizes)
    tokenizer_dir = ctx.out / "tokenizer"
    files = sorted(tokenizer_dir.iterdir()) if tokenizer_dir.is_dir() else list(ctx.model.tokenizer_files)
    fraction = engine.kv_cache_fraction
    draft = None
    if engine.draft is not None:  # draft-target: the draft engine (or checkpoint) beside the target, at its sizes
        draft = DraftServing(target.limits(ctx.out / engine.draft.dir, sizes),
                             ctx.spec.out.absolute() / engine.draft.dir)
    decoding = decoding_parameters(ctx.spec.speculative)
    if target.slot_model is not None:  # the kit's CPU model speculates itself (draft-target: in its own engine too)
        decoding |= cpu_parameters(ctx.spec.speculative, None if draft is None else draft.model_path)
    record = write_repository(ctx.out / "repo", limits, ctx.spec.repo,
                              model_path=ctx.spec.out.absolute() / target.model_dir, tokenizer_files=files,
                              plan_fraction=fraction if fraction is not None else build.kv_cache_fraction,
                              final_dir=ctx.spec.out.absolute() / "repo",
                              lora=target.lora_serving(ctx.out / target.model_dir, ctx.spec),
                              decoding=decoding, draft=draft)
    expect = Expectation(world_size=ctx.mapping.world_size, kv_cache_fraction=fraction)
    report = validate_repository(ctx.out / "repo", read_limits=limits_from_dir, model_dir=limits.model_dir,
                                 expect=expect)
    if report.errors:
        first = report.errors[0]
        raise KitError(f"the generated repository fails validation: {first.model}: {first.message}")
    ctx.records.repo = record
    if not record.text:
        ctx.reporter.note(f"repo: {ctx.model.source} has no tokenizer, so only tensorrt_llm (token ids in and out) "
                          "was written; add tokenizer files to the model for text in and out")
    ctx.reporter.note(f"repo: {target.name} target, max_batch_size {limits.max_batch_size}, decoupled "
                      f"{ctx.spec.repo.decoupled}, {len(report.findings)} validation note(s)")
