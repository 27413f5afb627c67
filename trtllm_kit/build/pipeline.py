"""Runs the build stages in order into one atomically placed output directory."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtllm_kit.build.artifact import check_out_dir, file_hashes, sha256_file, staged_dir, tool_versions, write_manifest
from trtllm_kit.build.convert import convert, work_items
from trtllm_kit.build.inspect import ModelSpec, inspect_model
from trtllm_kit.build.shard import Mapping, check_tp
from trtllm_kit.errors import VerifyError
from trtllm_kit.progress import Reporter
from trtllm_kit.spec import BuildSpec

VERIFY_MAX_PARAMETERS = 500_000_000


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


def run_build(spec: BuildSpec, reporter: Reporter | None = None) -> BuildResult:
    """Inspect, convert (and verify) into ``spec.out``; nothing is left behind on failure.

    Arguments:
        spec: the validated build spec.
        reporter: progress and notes (silent when omitted).
    """
    reporter = reporter or Reporter()
    timings: dict[str, float] = {}
    started = time.perf_counter()
    check_out_dir(spec.out, force=spec.force)
    model = inspect_model(spec.model, allow_pickle=spec.allow_pickle)
    mapping = Mapping(spec.tp, spec.pp)
    check_tp(model.hf.num_attention_heads, model.hf.num_key_value_heads, model.hf.intermediate_size, spec.tp)
    work_items(model, mapping)  # refuses pp larger than the layer count before any work
    reporter.note(f"{model.source}: {model.family.name} ({model.hf.architecture}), "
                  f"{model.hf.num_parameters / 1e6:.1f}M parameters, tp={spec.tp} pp={spec.pp}")
    with staged_dir(spec.out, force=spec.force) as stage:
        t0 = time.perf_counter()
        ckpt_dir = stage / "checkpoint"
        ckpt_dir.mkdir()
        with reporter.task("convert", model.weight_bytes) as advance:
            result = convert(model, ckpt_dir, mapping, spec.dtype, lambda _name, n: advance(n))
        timings["checkpoint"] = time.perf_counter() - t0
        _copy_tokenizer(model, stage / "tokenizer")
        verify_report = None
        if should_verify(spec, model):
            t0 = time.perf_counter()
            verify_report = _verify(ckpt_dir, model, reporter)
            timings["verify"] = time.perf_counter() - t0
        timings["total"] = time.perf_counter() - started
        summary = {
            "model": {"source": model.source, "path": str(model.path), "family": model.family.name,
                      "architecture": model.hf.architecture, "num_parameters": model.hf.num_parameters},
            "checkpoint": {"dir": "checkpoint", "dtype": result.dtype, **mapping.to_dict()},
            "verify": verify_report,
            "stages": list(timings),
        }
        manifest = {
            "spec": spec.to_dict(),
            "summary": summary,
            "inputs": {p.name: sha256_file(p) for p in (model.path / "config.json", *model.weight_files)},
            "tools": tool_versions(),
            "timings_s": {k: round(v, 3) for k, v in timings.items()},
            "outputs": file_hashes(stage),
        }
        write_manifest(stage, manifest)
    out_dir = spec.out.absolute()
    return BuildResult(out_dir, out_dir / "manifest.json", {"manifest": str(out_dir / "manifest.json"), **summary})


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
