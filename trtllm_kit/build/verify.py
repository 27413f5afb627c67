"""Numerical verification: the CPU runtime on a TensorRT-LLM checkpoint against transformers on the HF model."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import transformers

from trtllm_kit.errors import KitUsageError
from trtllm_kit.models.hf_config import read_hf_config
from trtllm_kit.runtime.model import CheckpointModel

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
FP32_ATOL = 1e-4
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


@dataclass(frozen=True)
class VerifyReport:
    """How closely the checkpoint's logits follow the HF model's on the same prompts."""

    max_abs_err: float     # max |logit_ckpt - logit_hf| over every prompt token and vocab entry
    max_rel_err: float     # max_abs_err / max |logit_hf| (the logit scale)
    top1_agreement: float  # fraction of tokens whose argmax agrees
    num_tokens: int
    compute_dtype: str
    tolerance: float       # the absolute tolerance max_abs_err was held to
    passed: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def default_prompts(vocab_size: int, seed: int = 0) -> list[list[int]]:
    """Deterministic token-id prompts of mixed lengths, drawn uniformly from the vocabulary.

    Arguments:
        vocab_size: the model's (unpadded) vocabulary size; seed: the generator seed.
    """
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (n,), generator=generator).tolist() for n in DEFAULT_PROMPT_LENGTHS]


def tolerance_for(compute_dtype: str, logit_scale: float) -> float:
    """The default absolute tolerance: ``FP32_ATOL`` in float32, else relative to the logit scale.

    Arguments:
        compute_dtype: float32, bfloat16 or float16; logit_scale: max |reference logit|.
    """
    if compute_dtype == "float32":
        return FP32_ATOL
    return LOW_PRECISION_REL_TOL[compute_dtype] * logit_scale


def load_hf_reference(hf_dir: Path, weight_dtype: torch.dtype, compute_dtype: torch.dtype) -> torch.nn.Module:
    """The HF model with weights rounded to the checkpoint dtype, computing in ``compute_dtype``.

    Loading in the checkpoint's dtype gives both sides the same rounded weights; the cast that follows gives
    them the same arithmetic. ``dtype`` is the keyword since transformers 4.56, ``torch_dtype`` before.

    Arguments:
        hf_dir: the HF model directory; weight_dtype: the checkpoint dtype; compute_dtype: the compute dtype.
    """
    major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    key = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
    model = transformers.AutoModelForCausalLM.from_pretrained(
        hf_dir, attn_implementation="eager", trust_remote_code=False, **{key: weight_dtype})
    return model.to(compute_dtype).eval()


def verify_checkpoint(ckpt_dir: Path, hf_dir: Path, *, prompts: list[list[int]] | None = None,
                      compute_dtype: str = "float32", atol: float | None = None) -> VerifyReport:
    """Run the checkpoint (CPU runtime) and the HF model on the same prompts and compare the logits.

    Tolerance: ``atol`` when given; else 1e-4 in float32, and for bfloat16/float16 compute a fraction of the
    logit scale (``LOW_PRECISION_REL_TOL``: 35% and 8% of max |logit|, 2.4x and 2.9x the worst difference
    measured on the built-in models, where conversion bugs measure 83-141%). The HF model then runs in the
    same low precision with the same rounded weights. Verify conversions in float32; low precision shows
    that GPU-like rounding stays within the dtype's usual noise. A numerical mismatch (NaN included) is
    reported as ``passed=False``, never raised; a checkpoint of another model raises ``KitUsageError``.

    Arguments:
        ckpt_dir: a TensorRT-LLM checkpoint directory.
        hf_dir: the HF model it was converted from.
        prompts: token-id lists; default: ``default_prompts(vocab_size)``.
        compute_dtype: float32, bfloat16 or float16.
        atol: an absolute tolerance overriding the default.
    """
    if compute_dtype not in DTYPES:
        raise KitUsageError(f"compute dtype {compute_dtype!r} is not one of {', '.join(DTYPES)}.")
    runtime = CheckpointModel.load(Path(ckpt_dir), DTYPES[compute_dtype])
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
    reference = load_hf_reference(Path(hf_dir), weight_dtype, DTYPES[compute_dtype])
    max_abs = scale = 0.0
    agree = total = 0
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt], dtype=torch.int64)
            got, want = runtime.forward(ids), reference(ids).logits.float()
            error = (got - want).abs().max().item()
            max_abs = max(max_abs, math.inf if math.isnan(error) else error)
            scale = max(scale, want.abs().max().item())
            agree += int((got.argmax(-1) == want.argmax(-1)).sum())
            total += ids.numel()
    tolerance = atol if atol is not None else tolerance_for(compute_dtype, scale)
    return VerifyReport(max_abs_err=max_abs, max_rel_err=max_abs / scale if scale else 0.0,
                        top1_agreement=agree / total, num_tokens=total, compute_dtype=compute_dtype,
                        tolerance=tolerance, passed=max_abs <= tolerance)
