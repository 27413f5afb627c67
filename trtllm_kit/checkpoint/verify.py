"""Numerical verification: the CPU runtime on a TensorRT-LLM checkpoint against transformers on the HF model."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from trtllm_kit.artifact import MANIFEST, Artifact
from trtllm_kit.checkpoint.heldout import corpus_windows, window_scores
from trtllm_kit.checkpoint.quality import ChoiceScores, choice_scores, load_questions
from trtllm_kit.checkpoint.reference import load_hf_reference as load_hf_reference  # its tests import it from here
from trtllm_kit.checkpoint.reference import reference_outputs
from trtllm_kit.checkpoint.reference_cache import CACHE_DIR
from trtllm_kit.errors import KitUsageError
from trtllm_kit.models.hf_config import read_hf_config
from trtllm_kit.models.text_tokenizer import load_text_tokenizer
from trtllm_kit.runtime.model import CheckpointModel

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Float32 tolerance: the larger of an absolute floor and a fraction of the logit scale. Two float32 runs of one
# model differ by their orders of summation, and that difference grows with the logits: transformers in float32
# differs from itself in float64 by 2.2e-6 to 3.6e-6 of the scale on the built-in models and SmolLM2-135M
# (scale 4.3-4.7 and 34.5), and the kit's float32 logits from transformers' by 3.2e-6 to 4.6e-6 (1.59e-4 on
# SmolLM2, whose float32 reference is itself 1.05e-4 from float64). 2e-5 of the scale is 4.3x the worst of those;
# on SmolLM2 a final norm 0.1% off measures 1.0e-3 of the scale, 50x the bound (python benchmarks/float32_noise.py).
FP32_ATOL = 1e-4
FP32_REL_TOL = 2e-5
# Low-precision tolerance, relative to the logit scale (max |reference logit|). The HF model runs in the same
# dtype with the same rounded weights, so the difference is rounding in another order (fused qkv GEMM,
# per-rank partial sums, fp32 RoPE and attention scores as GPU kernels keep them), amplified by the layers.
# Measured max_abs_err / scale over 75 runs per dtype (builtin tiny-llama/qwen2/mistral x tp*pp in
# {1x1, 2x1, 1x2, 2x2, 4x1} x 5 prompt sets of 1-100 tokens): bfloat16 median 0.10, worst 0.144;
# float16 median 0.011, worst 0.028. That spread is the dtype's, not the runtime's: transformers in bf16
# differs from itself in fp32 by up to 0.10 on the same models. Structural conversion bugs (fc/gate or k/v
# swapped, KV heads duplicated in the wrong order, GPT-J rotary layout, lm_head rows shifted) measured
# 0.83-1.41 in every dtype. bfloat16 0.35 sits 2.4x above the noise and 2.4x below the smallest bug; float16
# 0.08 is 2.9x above its noise. Small scale errors (a norm off by 5%: 0.05) need the float32 check (1e-4).
LOW_PRECISION_REL_TOL = {"bfloat16": 0.35, "float16": 0.08}
DEFAULT_PROMPT_LENGTHS = (1, 5, 16, 37)
# Quantized checkpoints are held, on the held-out text, to the mean per-token KL divergence KL(unquantized ‖
# quantized) and to the top-1 agreement of the two models (the KV cache's share included); and, when the
# unquantized model predicts the text better than chance, to |relative perplexity change| as well.
# Measured on the built-in models (tests/quant/test_accuracy.py): |change| ≤ 1.2 %, KL W8A16 ≤ 0.005,
# FP8 ≤ 0.11, SmoothQuant ≤ 0.03, INT8 KV alone ≤ 0.007; top-1 agreement W8A16 ≥ 0.79, SmoothQuant ≥ 0.69,
# FP8 ≥ 0.37 (these models' logits are flat, so close calls flip), INT8 KV alone 0.82. A 2x weight scale in FP8
# measured KL 0.32 and top-1 0.125, an INT8 KV scale 4x too small KL 0.48 and top-1 0.074.
# A perplexity is meaningful only below the vocabulary size (a uniform guess scores exactly that): the change
# of a model that scores worse than uniform/e (cross-entropy within 1 nat of log V, as random-weight models
# and a model evaluated on text it was never trained on do) says nothing about the quantization, so it is
# reported but not gated. KL and top-1 agreement are meaningful for every model.
# NVFP4 (4-bit weights, dequantized on the CPU): KL 0.28-0.32 and top-1 0.14-0.155 on tiny-llama/mistral/qwen2;
# bounds at twice the worst KL and half the worst agreement; the perplexity change (not gated on these models,
# measured -1.8 % to +1.5 %) held to 5 %.
# W4A16 AWQ (int4 groups of 128, dequantized on the CPU; engine checkpoints, 4 windows x 32 tokens): KL 0.34-0.39
# and top-1 0.102-0.107 on tiny-llama/mistral/qwen2; bounds by the same rule (KL 0.8, top-1 0.05, perplexity 5 %).
# The perplexity bounds are set on real weights (SmolLM2-135M-Instruct, builtin:smollm2-135m-instruct, on the shipped
# corpus, against the unquantized model in the checkpoint's dtype; benchmarks/quant_quality.py, docs/quant-quality.md):
# W8A16 +0.22 % (bound 1 %), SmoothQuant per channel and per token +0.91 % (bound 3 %), FP8 +2.88 % and with an FP8
# KV cache +2.72 % (ModelOpt's FP8 fake quantization of the same model measures +1.95 % and +2.81 %: a
# 135M model loses more than the near-zero published for large ones), NVFP4 +25.6 % (bound 32 %; 4-bit weights
# on 576-wide layers). Those figures were taken with perplexity on the calibration corpus, before the held-out text;
# they are to be taken again on it. On the held-out text: FP8 +4.17 % (bound 6 %; ModelOpt's +2.43 %), SmoothQuant
# +1.00 %. INT4 AWQ at --awq-group-size 64 (groups of 128 do not divide the hidden size
# 576), on the held-out text: +23.6 % (bound 30 %; ModelOpt's AWQ with block size 64 measures +23.4 %).
PERPLEXITY_BOUNDS = {"W8A16": 0.01, "FP8": 0.06, "SQ": 0.03, "NVFP4": 0.32, "W4A16_AWQ": 0.30, None: 0.01}
KL_BOUNDS = {"W8A16": 0.02, "FP8": 0.2, "SQ": 0.1, "NVFP4": 0.65, "W4A16_AWQ": 0.8, None: 0.05}
TOP1_BOUNDS = {"W8A16": 0.6, "FP8": 0.25, "SQ": 0.5, "NVFP4": 0.07, "W4A16_AWQ": 0.05, None: 0.6}
PERPLEXITY_MARGIN_NATS = 1.0
# what build and verify note when the HF model's answers were read, not computed (``reference_cached``)
CACHED_REFERENCE = f"the unquantized model's answers came from the kit's cache ({CACHE_DIR}/)"


@dataclass(frozen=True)
class VerifyReport:
    """How closely the checkpoint's logits follow the HF model's on the same prompts."""

    max_abs_err: float     # max |logit_ckpt - logit_hf| over every prompt token and vocab entry
    max_rel_err: float     # max_abs_err / max |logit_hf| (the logit scale)
    top1_agreement: float  # fraction of tokens whose argmax agrees
    num_tokens: int
    compute_dtype: str
    tolerance: float       # the absolute tolerance max_abs_err was held to (unquantized checkpoints)
    passed: bool
    reference_cached: bool = False         # the HF model's answers came from the kit's cache (reference_cache)
    quantization: str | None = None        # "quant_algo/kv_cache_quant_algo" of a quantized checkpoint
    perplexity: float | None = None        # of the checkpoint on the held-out text (quantized checkpoints)
    reference_perplexity: float | None = None  # of the unquantized HF model on the same tokens
    perplexity_change: float | None = None     # perplexity / reference_perplexity - 1
    perplexity_bound: float | None = None      # the largest |change| that passes
    kl_divergence: float | None = None         # mean per-token KL(unquantized ‖ checkpoint), nats
    kl_bound: float | None = None              # the largest KL that passes
    corpus_top1_agreement: float | None = None  # share of held-out tokens whose argmax both models agree on
    top1_bound: float | None = None            # the smallest agreement that passes
    vocab_size: int | None = None
    perplexity_gated: bool | None = None       # whether the reference beats uniform/e, so the change is gated
    choice_accuracy: float | None = None       # of the checkpoint on the shipped multiple-choice set (reported)
    reference_choice_accuracy: float | None = None  # of the unquantized HF model on the same questions
    choice_agreement: float | None = None      # share of questions both models pick the same option for

    def quality_summary(self) -> str:
        """One line on a quantized checkpoint's perplexity, KL divergence and top-1 agreement against the
        unquantized model."""
        if self.perplexity_gated:
            gate = f"bound ±{self.perplexity_bound:.0%}"
        else:
            gate = (f"not gated: the unquantized model scores worse than uniform/e over its {self.vocab_size} "
                    "tokens on this text, so its perplexity says nothing")
        return (f"{self.quantization}: perplexity {self.perplexity:.4g} vs {self.reference_perplexity:.4g} "
                f"unquantized ({self.perplexity_change:+.2%}, {gate}), KL divergence {self.kl_divergence:.3g} "
                f"(bound {self.kl_bound:.3g}), top-1 agreement {self.corpus_top1_agreement:.1%} (bound "
                f"{self.top1_bound:.0%}) on the held-out text; multiple-choice accuracy {self.choice_accuracy:.1%} "
                f"vs {self.reference_choice_accuracy:.1%} unquantized (same pick on {self.choice_agreement:.0%} of "
                "the questions, reported)")

    def quality_failure(self) -> str:
        """The sentence for a quantized checkpoint that exceeded a bound."""
        return (f"the quantized checkpoint strays too far from the unquantized model: {self.quality_summary()}; "
                "calibrate on more or other data (--calib-data, --calib-samples), choose another --quant, or build "
                "with --no-verify to ship it as measured.")

    def to_dict(self) -> dict[str, Any]:
        """All fields; the perplexity and KL fields only for a quantized checkpoint."""
        values = asdict(self)
        if self.quantization is None:
            values = {k: v for k, v in values.items() if k in ("max_abs_err", "max_rel_err", "top1_agreement",
                                                                 "num_tokens", "compute_dtype", "tolerance", "passed",
                                                                 "reference_cached")}
        return values


def recorded_source(path: Path) -> str:
    """The HF model a build's checkpoint came from, as its ``manifest.json`` records it.

    Arguments:
        path: a build's output directory or its ``checkpoint/``.
    """
    out = path if (path / MANIFEST).is_file() else path.parent
    if not (out / MANIFEST).is_file():
        raise KitUsageError(f"{path} has no {MANIFEST} beside it, so its source model is unknown; pass --against "
                            "with the HF model it was converted from.")
    model = Artifact.read(out).records.model
    for candidate in (model.source, model.path) if model else ():
        path = Path(candidate).expanduser()
        if candidate.startswith("builtin:") or path.is_dir() or (path.suffix.lower() == ".gguf" and path.is_file()):
            return candidate
    raise KitUsageError(f"{out / MANIFEST} records the source model {model.source if model else None!r}, which is "
                        "not found here; pass --against with the HF model it was converted from.")


def default_prompts(vocab_size: int, seed: int = 0) -> list[list[int]]:
    """Deterministic token-id prompts of mixed lengths, drawn uniformly from the vocabulary.

    Arguments:
        vocab_size: the model's (unpadded) vocabulary size; seed: the generator seed.
    """
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (n,), generator=generator).tolist() for n in DEFAULT_PROMPT_LENGTHS]


def tolerance_for(compute_dtype: str, logit_scale: float) -> float:
    """The default absolute tolerance: in float32 the larger of ``FP32_ATOL`` and ``FP32_REL_TOL`` of the logit
    scale, else ``LOW_PRECISION_REL_TOL`` of it.

    Arguments:
        compute_dtype: float32, bfloat16 or float16; logit_scale: max |reference logit|.
    """
    if compute_dtype == "float32":
        return max(FP32_ATOL, FP32_REL_TOL * logit_scale)
    return LOW_PRECISION_REL_TOL[compute_dtype] * logit_scale


def verify_checkpoint(ckpt_dir: Path, hf_dir: Path, *, prompts: list[list[int]] | None = None,
                      compute_dtype: str = "float32", atol: float | None = None,
                      load: Callable[[torch.dtype], CheckpointModel] | None = None) -> VerifyReport:
    """Run the checkpoint (CPU runtime) and the HF model on the same prompts and compare the logits.

    Tolerance: ``atol`` when given; else in float32 1e-4 or 2e-5 of the logit scale (max |reference logit|),
    whichever is larger (``FP32_REL_TOL``), and for bfloat16/float16 compute a fraction of the
    logit scale (``LOW_PRECISION_REL_TOL``: 35% and 8% of max |logit|, 2.4x and 2.9x the worst difference
    measured on the built-in models, where conversion bugs measure 83-141%). The HF model then runs in the
    same low precision with the same rounded weights. Verify conversions in float32; low precision shows
    that GPU-like rounding stays within the dtype's usual noise. A numerical mismatch (NaN included) is
    reported as ``passed=False``, never raised; a checkpoint of another model raises ``KitUsageError``. The HF
    model's answers come from the kit's cache when it has run on the same files and inputs (``reference_cache``).

    Arguments:
        ckpt_dir: a TensorRT-LLM checkpoint directory.
        hf_dir: the HF model it was converted from.
        prompts: token-id lists; default: ``default_prompts(vocab_size)``.
        compute_dtype: float32, bfloat16 or float16.
        atol: an absolute tolerance overriding the default.
        load: compute dtype → the runtime model (default: ``CheckpointModel.load(ckpt_dir, ...)``; another
        checkpoint format, such as the llmapi target's unified one, brings its loader).
    """
    if compute_dtype not in DTYPES:
        raise KitUsageError(f"compute dtype {compute_dtype!r} is not one of {', '.join(DTYPES)}.")
    runtime = (load or (lambda dtype: CheckpointModel.load(Path(ckpt_dir), dtype)))(DTYPES[compute_dtype])
    vocab_size = runtime.dims.vocab_size
    prompts = default_prompts(vocab_size) if prompts is None else prompts
    bad = [p for p in prompts if not p or min(p) < 0 or max(p) >= vocab_size]
    if bad:
        raise KitUsageError(f"prompt {bad[0][:8]} is empty or holds ids outside [0, {vocab_size}).")
    hf = read_hf_config(Path(hf_dir))  # a clear ModelError for a missing or remote-code config
    dims = runtime.dims
    pairs = [("architecture", hf.architecture, runtime.config["architecture"]),
             ("vocab_size", hf.vocab_size, vocab_size), ("hidden_size", hf.hidden_size, dims.hidden_size),
             ("num_hidden_layers", hf.num_hidden_layers, dims.num_layers),
             ("num_key_value_heads", hf.num_key_value_heads, dims.num_kv_heads)]
    for key, hf_value, ckpt_value in pairs:
        if hf_value != ckpt_value:
            raise KitUsageError(f"{ckpt_dir} was not converted from {hf_dir}: {key} is {ckpt_value} in the "
                                f"checkpoint but {hf_value} in the HF model.")
    weight_dtype = DTYPES.get(str(runtime.config.get("dtype")), torch.float32)
    quant = runtime.config.get("quantization") or {}
    algo, kv_algo = quant.get("quant_algo"), quant.get("kv_cache_quant_algo")
    is_quantized = algo is not None or kv_algo is not None
    windows, questions = (corpus_windows(Path(hf_dir)), load_questions()) if is_quantized else ([], [])
    reference = reference_outputs(Path(hf_dir), weight_dtype, DTYPES[compute_dtype], prompts, windows, questions)
    max_abs = scale = 0.0
    agree = total = 0
    with torch.no_grad():
        for prompt, logits in zip(prompts, reference.prompt_logits, strict=True):
            ids = torch.tensor([prompt], dtype=torch.int64)
            got, want = runtime.forward(ids), logits.float()
            error = (got - want).abs().max().item()
            max_abs = max(max_abs, math.inf if math.isnan(error) else error)
            scale = max(scale, want.abs().max().item())
            agree += int((got.argmax(-1) == want.argmax(-1)).sum())
            total += ids.numel()
    tolerance = atol if atol is not None else tolerance_for(compute_dtype, scale)
    report = VerifyReport(max_abs_err=max_abs, max_rel_err=max_abs / scale if scale else 0.0,
                          top1_agreement=agree / total, num_tokens=total, compute_dtype=compute_dtype,
                          tolerance=tolerance, passed=max_abs <= tolerance, reference_cached=reference.is_cached)
    if not is_quantized:
        return report
    ppl, ppl_ref, kl, top1 = window_scores(runtime.forward, reference.window_logits, windows)
    picks = choice_scores(runtime.forward, load_text_tokenizer(Path(hf_dir)).encode, questions)
    reference_picks = ChoiceScores(reference.picks)
    change = ppl / ppl_ref - 1.0
    bound, kl_bound = quality_bounds(algo)
    top1_bound = TOP1_BOUNDS[_bound_key(algo)]
    gated = perplexity_is_meaningful(ppl_ref, vocab_size)
    passed = (math.isfinite(ppl) and math.isfinite(kl) and kl <= kl_bound and top1 >= top1_bound
              and (not gated or abs(change) <= bound))
    return replace(report, quantization=f"{algo}/{kv_algo}", perplexity=ppl, reference_perplexity=ppl_ref,
                   perplexity_change=change, perplexity_bound=bound, kl_divergence=kl, kl_bound=kl_bound,
                   corpus_top1_agreement=top1, top1_bound=top1_bound, vocab_size=vocab_size,
                   perplexity_gated=gated, passed=passed, choice_accuracy=picks.accuracy,
                   reference_choice_accuracy=reference_picks.accuracy,
                   choice_agreement=picks.agreement(reference_picks))


def perplexity_is_meaningful(reference_perplexity: float, vocab_size: int) -> bool:
    """Whether the unquantized model predicts the text better than a uniform guess by ``PERPLEXITY_MARGIN_NATS``
    (its cross-entropy below log V − 1 nat), so that a relative perplexity change measures the quantization.

    Arguments:
        reference_perplexity: the unquantized model's perplexity; vocab_size: its vocabulary size.
    """
    return (math.isfinite(reference_perplexity)
            and math.log(reference_perplexity) < math.log(vocab_size) - PERPLEXITY_MARGIN_NATS)


def quality_bounds(quant_algo: str | None) -> tuple[float, float]:
    """(largest |relative perplexity change|, largest mean KL) a quantized checkpoint may show.

    Arguments:
        quant_algo: the checkpoint's ``quant_algo`` (None for a quantized KV cache alone).
    """
    key = _bound_key(quant_algo)
    return PERPLEXITY_BOUNDS[key], KL_BOUNDS[key]


def _bound_key(quant_algo: str | None) -> str | None:
    return "SQ" if quant_algo and quant_algo.startswith("W8A8_SQ") else quant_algo
