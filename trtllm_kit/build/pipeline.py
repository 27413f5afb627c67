"""Runs the build stages in order into one atomically placed output directory.

Each stage is a function of the ``BuildContext``: it writes its own subdirectory of the staging
directory and adds its section to ``ctx.summary``. ``spec.until`` names the last stage to run.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtllm_kit.build.artifact import check_out_dir, file_hashes, sha256_file, staged_dir, tool_versions, write_manifest
from trtllm_kit.build.convert import convert, work_items
from trtllm_kit.build.inspect import ModelSpec, inspect_model
from trtllm_kit.build.shard import Mapping, check_tp
from trtllm_kit.errors import VerifyError
from trtllm_kit.progress import Reporter
from trtllm_kit.spec import STAGES, BuildSpec

VERIFY_MAX_PARAMETERS = 500_000_000


@dataclass
class BuildContext:
    """What the stages share: the spec, the inspected model, the staging directory and the results so far."""

    spec: BuildSpec
    model: ModelSpec
    mapping: Mapping
    reporter: Reporter
    out: Path
    summary: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class BuildResult:
    """What a build produced: the manifest and a summary for ``--json``."""

    out_dir: Path
    manifest_path: Path
    summary: dict[str, Any]


def should_verify(spec: BuildSpec, model: ModelSpec) -> bool:
    if spec.verify is not None:
        return spec.verify
    return model.hf.num_parameters <= VERIFY_MAX_PARAMETERS


def checkpoint_stage(ctx: BuildContext) -> None:
    """HF weights → ``checkpoint/`` (+ ``tokenizer/``), verified on the CPU for small models."""
    ckpt_dir = ctx.out / "checkpoint"
    ckpt_dir.mkdir()
    with ctx.reporter.task("convert", ctx.model.weight_bytes) as advance:
        result = convert(ctx.model, ckpt_dir, ctx.mapping, ctx.spec.dtype, lambda _name, n: advance(n))
    _copy_tokenizer(ctx.model, ctx.out / "tokenizer")
    ctx.summary["checkpoint"] = {"dir": "checkpoint", "dtype": result.dtype, **ctx.mapping.to_dict()}
    if should_verify(ctx.spec, ctx.model):
        t0 = time.perf_counter()
        ctx.summary["verify"] = _verify(ckpt_dir, ctx.model, ctx.reporter)
        ctx.timings["verify"] = time.perf_counter() - t0


STAGE_FUNCTIONS: dict[str, Callable[[BuildContext], None]] = {"checkpoint": checkpoint_stage}


def run_build(spec: BuildSpec, reporter: Reporter | None = None) -> BuildResult:
    """Run the stages up to ``spec.until`` into ``spec.out``; nothing is left behind on failure.

    Arguments:
        spec: the validated build spec.
        reporter: progress and notes (silent when omitted).
    """
    reporter = reporter or Reporter()
    started = time.perf_counter()
    check_out_dir(spec.out, force=spec.force)
    model = inspect_model(spec.model, allow_pickle=spec.allow_pickle)
    mapping = Mapping(spec.tp, spec.pp)
    check_tp(model.hf.num_attention_heads, model.hf.num_key_value_heads, model.hf.intermediate_size, spec.tp)
    work_items(model, mapping)  # refuses pp larger than the layer count before any work
    reporter.note(f"{model.source}: {model.family.name} ({model.hf.architecture}), "
                  f"{model.hf.num_parameters / 1e6:.1f}M parameters, tp={spec.tp} pp={spec.pp}")
    stages = STAGES[: STAGES.index(spec.until) + 1]
    with staged_dir(spec.out, force=spec.force) as stage_dir:
        ctx = BuildContext(spec, model, mapping, reporter, stage_dir)
        ctx.summary["model"] = {"source": model.source, "path": str(model.path), "family": model.family.name,
                                "architecture": model.hf.architecture, "num_parameters": model.hf.num_parameters}
        for name in stages:
            t0 = time.perf_counter()
            STAGE_FUNCTIONS[name](ctx)
            ctx.timings[name] = time.perf_counter() - t0
        ctx.timings["total"] = time.perf_counter() - started
        ctx.summary["stages"] = list(stages)
        manifest = {
            "spec": spec.to_dict(),
            "summary": ctx.summary,
            "inputs": {p.name: sha256_file(p) for p in (model.path / "config.json", *model.weight_files)},
            "tools": tool_versions(),
            "timings_s": {k: round(v, 3) for k, v in ctx.timings.items()},
            "outputs": file_hashes(stage_dir),
        }
        write_manifest(stage_dir, manifest)
    out_dir = spec.out.absolute()
    return BuildResult(out_dir, out_dir / "manifest.json", {"manifest": str(out_dir / "manifest.json"), **ctx.summary})


def _copy_tokenizer(model: ModelSpec, dest: Path) -> None:
    dest.mkdir()
    for path in model.tokenizer_files:
        shutil.copy2(path, dest / path.name)


def _verify(ckpt_dir: Path, model: ModelSpec, reporter: Reporter) -> dict[str, Any]:
    from trtllm_kit.build.verify import verify_checkpoint

    reporter.note("verify: running the checkpoint on the CPU against transformers")
    report = verify_checkpoint(ckpt_dir, model.path)
    if not report.passed:
        raise VerifyError(f"verify failed: max abs logit error {report.max_abs_err:.3g} exceeds the tolerance "
                          f"{report.tolerance:.3g} (top-1 agreement {report.top1_agreement:.1%}); the checkpoint "
                          "does not compute what the HF model does.")
    reporter.note(f"verify: max abs error {report.max_abs_err:.2e}, top-1 agreement {report.top1_agreement:.1%}")
    return report.to_dict()
