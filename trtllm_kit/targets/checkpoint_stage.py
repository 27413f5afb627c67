"""The TensorRT-LLM checkpoint stage the engine and cpu targets share: calibrate when the quantization needs it,
convert, copy the tokenizer, and verify small models on the CPU against transformers."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_kit.artifact import CheckpointRecord
from trtllm_kit.errors import VerifyError
from trtllm_kit.progress import Reporter
from trtllm_kit.spec import BuildSpec
from trtllm_kit.targets.base import BuildContext

# Conversion, calibration and verification import torch; the registry imports this module, and serve and the CLI
# import the registry, so those modules are imported where a stage runs.
if TYPE_CHECKING:
    from trtllm_kit.models.inspect import ModelSpec
    from trtllm_kit.quant.calibrate import CalibrationStats

VERIFY_MAX_PARAMETERS = 500_000_000


def should_verify(spec: BuildSpec, model: ModelSpec) -> bool:
    if spec.build.verify is not None:
        return spec.build.verify
    return model.hf.num_parameters <= VERIFY_MAX_PARAMETERS


def calibration_stats(ctx: BuildContext) -> CalibrationStats | None:
    """Calibrate when the quantization needs it, or take the statistics of an earlier build of the same model and
    calibration from the kit's cache (``calibration_cache``); they are saved with the artifact
    (``calibration/stats.safetensors`` + ``.json``)."""
    quant = ctx.spec.quant_config()
    if not quant.needs_calibration:
        return None
    from trtllm_kit.checkpoint.calibration_cache import CACHED_CALIBRATION, cached_calibration, calibration_key
    from trtllm_kit.quant.calib_size import calibration_device
    from trtllm_kit.quant.calibrate import calibrate, calibration_params

    t0 = time.perf_counter()
    device = calibration_device()
    key = calibration_key(ctx.inputs, ctx.model.tokenizer_files, calibration_params(quant, device))
    stats, cached = cached_calibration(key, lambda: calibrate(ctx.model.path, quant, ctx.reporter, device))
    if cached:
        ctx.reporter.note(f"calibrate: {CACHED_CALIBRATION}")
    stats.save(ctx.out / "calibration")
    ctx.timings["calibrate"] = time.perf_counter() - t0
    ctx.records.calibration = {"dir": "calibration", **stats.params, "cached": cached}
    return stats


def trtllm_checkpoint_stage(ctx: BuildContext) -> None:
    """HF weights → the TensorRT-LLM ``checkpoint/`` (+ ``tokenizer/``), verified on the CPU for small models. A
    pre-quantized input is converted with its own scales (``checkpoint/prequantized.py``): no calibration, and
    no verify against transformers (which cannot load every such format)."""
    from trtllm_kit.checkpoint.convert import convert, quant_transform  # torch
    from trtllm_kit.checkpoint.heads import add_heads_config
    from trtllm_kit.checkpoint.prequantized import PreQuantizedTransform
    from trtllm_kit.quant.prequantized import detect_prequantized
    from trtllm_kit.spec.heads_reader import read_heads  # safetensors headers: torch

    ckpt_dir = ctx.out / "checkpoint"
    ckpt_dir.mkdir()
    fmt = detect_prequantized(ctx.model.path)
    quant, stats = ctx.spec.quant_config(), None if fmt else calibration_stats(ctx)
    transform = quant_transform(ctx.model, ctx.mapping, ctx.spec.build.dtype, quant, stats)
    heads = read_heads(ctx.spec.speculative, ctx.model.hf)
    with ctx.reporter.task("convert", ctx.model.weight_bytes) as advance:
        result = convert(ctx.model, ckpt_dir, ctx.mapping, ctx.spec.build.dtype, lambda _name, n: advance(n),
                         transform, heads)
    copy_tokenizer(ctx.model, ctx.out / "tokenizer")
    quantization = transform.quantization if transform else None
    if isinstance(transform, PreQuantizedTransform):
        label = transform.fmt.label
        quantization = {**transform.quantization, "input": label, "rescaled_modules": transform.num_rescaled}
        ctx.reporter.note(f"convert: {label} input ({transform.fmt.declared_in}): {transform.summary}")
    ctx.records.checkpoint = CheckpointRecord(dir="checkpoint", dtype=result.dtype, **ctx.mapping.to_dict(),
                                              quantization=quantization)
    if fmt is None and should_verify(ctx.spec, ctx.model):
        t0 = time.perf_counter()
        ctx.records.verify = run_verify(ckpt_dir, ctx.model, ctx.reporter)
        ctx.timings["verify"] = time.perf_counter() - t0
    if heads is not None:  # after verify: the CPU runtime runs the base architecture
        add_heads_config(ckpt_dir, heads, ctx.spec.speculative.draft_len)
        ctx.reporter.note(f"convert: the {ctx.spec.speculative.mode} heads of {ctx.spec.speculative.draft_model} "
                          "are in every rank file")


def copy_tokenizer(model: ModelSpec, dest: Path) -> None:
    """The model's tokenizer files into the new directory ``dest``.

    Arguments:
        model: the inspected model; dest: the directory to create.
    """
    dest.mkdir()
    for path in model.tokenizer_files:
        shutil.copy2(path, dest / path.name)


def run_verify(ckpt_dir: Path, model: ModelSpec, reporter: Reporter, load: Any = None) -> dict[str, Any]:
    """Verify ``ckpt_dir`` against the HF model; a failure raises ``VerifyError``, a pass returns the report.

    Arguments:
        ckpt_dir: the checkpoint; model: the HF model; reporter: notes; load: the checkpoint's loader (see
        ``verify_checkpoint``; default: the TensorRT-LLM checkpoint's).
    """
    from trtllm_kit.checkpoint.verify import CACHED_REFERENCE, verify_checkpoint  # torch, transformers

    reporter.note("verify: running the checkpoint on the CPU against transformers")
    report = verify_checkpoint(ckpt_dir, model.path, load=load)
    if not report.passed and report.quantization:
        raise VerifyError(f"verify failed: {report.quality_failure()}")
    if not report.passed:
        raise VerifyError(f"verify failed: max abs logit error {report.max_abs_err:.3g} exceeds the tolerance "
                          f"{report.tolerance:.3g} (top-1 agreement {report.top1_agreement:.1%}); the checkpoint "
                          "does not compute what the HF model does.")
    if report.reference_cached:
        reporter.note(f"verify: {CACHED_REFERENCE}")
    reporter.note(f"verify: max abs error {report.max_abs_err:.2e}, max rel error {report.max_rel_err:.2e}, "
                  f"top-1 agreement {report.top1_agreement:.1%}")
    if report.quantization:
        reporter.note(f"verify: {report.quality_summary()}")
    return report.to_dict()
