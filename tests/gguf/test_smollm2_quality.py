"""The quality gate set on real weights: the real model built in FP8 and in INT8 SmoothQuant (per channel, per
token) passes verify with its perplexity change on the held-out text within the bound ``checkpoint/verify.py``
documents for the format (the build refuses past it), and the quantized model still answers the shipped
multiple-choice set as the unquantized one does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gguf_files import SMOLLM2

from trtllm_kit.build.pipeline import run_build
from trtllm_kit.checkpoint.verify import FP32_ATOL, FP32_REL_TOL, PERPLEXITY_BOUNDS, VerifyReport
from trtllm_kit.errors import KitUsageError
from trtllm_kit.spec import build_spec

pytestmark = pytest.mark.slow
FORMATS = {"FP8": {"quant": "fp8"}, "SQ": {"quant": "int8-sq", "per_channel": True, "per_token": True}}


@pytest.mark.parametrize("bound_key", FORMATS)
def test_the_real_model_quantizes_within_the_documented_bound(smollm2_dir: Path, tmp_path: Path,
                                                              bound_key: str) -> None:
    result = run_build(build_spec({}, {"model": SMOLLM2, "out": tmp_path / "out", "quant": FORMATS[bound_key],
                                       "build": {"target": "cpu", "until": "checkpoint", "verify": True}}))
    verify: dict[str, Any] | None = result.artifact.records.verify
    assert verify is not None and verify["passed"]
    assert verify["perplexity_gated"]  # a trained model: the change is meaningful, so it is held to the bound
    assert abs(verify["perplexity_change"]) <= PERPLEXITY_BOUNDS[bound_key] == verify["perplexity_bound"]
    assert verify["reference_choice_accuracy"] >= 0.6 and verify["choice_accuracy"] >= 0.6
    assert verify["choice_agreement"] >= 0.85


def test_the_readme_build_passes_verify_with_float32_noise_scaled_to_its_logits(smollm2_dir: Path,
                                                                                 tmp_path: Path) -> None:
    """The README's first build, as written (the model's float16 weights, verified in float32): the kit's logits
    are within float32's own noise of transformers', which grows with the logits (``FP32_REL_TOL``)."""
    result = run_build(build_spec({}, {"model": SMOLLM2, "out": tmp_path / "out", "build": {"until": "checkpoint"}}))
    verify: dict[str, Any] | None = result.artifact.records.verify
    assert verify is not None and verify["passed"] and verify["compute_dtype"] == "float32"
    scale = verify["max_abs_err"] / verify["max_rel_err"]
    assert scale > 20  # a trained model's logits (34.5), where 1e-4 is below float32's noise
    assert verify["tolerance"] == pytest.approx(FP32_REL_TOL * scale) and verify["tolerance"] > FP32_ATOL
    assert verify["top1_agreement"] == 1.0 and verify["max_rel_err"] < FP32_REL_TOL / 2


def test_a_refusal_states_the_figure_and_the_flag_that_accepts_it() -> None:
    report = VerifyReport(max_abs_err=1.0, max_rel_err=0.1, top1_agreement=0.9, num_tokens=59, compute_dtype="float32",
                          tolerance=1e-4, passed=False, quantization="NVFP4/None", perplexity=43.9,
                          reference_perplexity=35.0, perplexity_change=0.254, perplexity_bound=0.05,
                          kl_divergence=0.3, kl_bound=0.65, corpus_top1_agreement=0.7, top1_bound=0.07,
                          vocab_size=49152, perplexity_gated=True, choice_accuracy=0.6,
                          reference_choice_accuracy=0.7, choice_agreement=0.8)
    message = report.quality_failure()
    assert "perplexity 43.9 vs 35 unquantized (+25.40%, bound ±5%)" in message
    assert message.endswith("or build with --no-verify to ship it as measured.")


def test_int4_awq_is_refused_before_any_work_when_the_widths_are_not_whole_groups(smollm2_dir: Path,
                                                                                  tmp_path: Path) -> None:
    """SmolLM2's hidden size 576 is 4.5 groups of 128 (and 9 of 64): one sentence naming the group size that fits,
    before calibration (it was a reshape error)."""
    with pytest.raises(KitUsageError) as refused:
        run_build(build_spec({}, {"model": SMOLLM2, "out": tmp_path / "out", "quant": {"quant": "int4-awq"},
                                  "build": {"target": "llmapi"}}))
    assert str(refused.value) == ("--quant int4-awq quantizes groups of 128 input features, but the model's hidden "
                                  "size (q/k/v, gate/up inputs) is 576, not a multiple of 128; build with "
                                  "--awq-group-size 64.")
    assert not (tmp_path / "out").exists()
