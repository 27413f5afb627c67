"""verify_checkpoint: passes converted checkpoints, reports broken ones without raising."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from trtllm_kit.checkpoint.convert import convert_checkpoint
from trtllm_kit.checkpoint.verify import (
    DEFAULT_PROMPT_LENGTHS,
    FP32_ATOL,
    FP32_REL_TOL,
    LOW_PRECISION_REL_TOL,
    VerifyReport,
    default_prompts,
    tolerance_for,
    verify_checkpoint,
)
from trtllm_kit.errors import KitUsageError
from trtllm_kit.models.builtin import builtin_dir

VOCAB = 1031  # builtin tiny-llama: GQA, llama3 RoPE scaling, odd vocabulary, 3 layers, bfloat16 weights


@pytest.fixture(scope="module")
def builtin(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRTLLM_KIT_CACHE", str(tmp_path_factory.mktemp("cache")))
        return {name: builtin_dir(name) for name in ("tiny-llama", "tiny-qwen2")}


@pytest.fixture(scope="module")
def hf_dir(builtin: dict[str, Path]) -> Path:
    return builtin["tiny-llama"]


@pytest.fixture(scope="module")
def checkpoints(hf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ckpt")
    out = {}
    for dtype in ("float32", "bfloat16", "float16"):
        out[dtype] = root / dtype
        convert_checkpoint(hf_dir, out[dtype], tp_size=2, pp_size=2, dtype=dtype)
    return out


def test_fp32_checkpoint_passes(checkpoints, hf_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("TRTLLM_KIT_CACHE", str(tmp_path))  # an empty cache: the reference is computed
    report = verify_checkpoint(checkpoints["float32"], hf_dir)
    assert report.passed and report.tolerance == 1e-4 and report.compute_dtype == "float32"
    assert report.max_abs_err < 1e-4 and report.top1_agreement == 1.0
    assert report.num_tokens == sum(DEFAULT_PROMPT_LENGTHS)
    assert report.to_dict() == {"max_abs_err": report.max_abs_err, "max_rel_err": report.max_rel_err,
                                "top1_agreement": 1.0, "num_tokens": sum(DEFAULT_PROMPT_LENGTHS),
                                "compute_dtype": "float32", "tolerance": 1e-4, "passed": True,
                                "reference_cached": False}


def test_the_float32_tolerance_grows_with_the_logits_past_its_floor():
    assert tolerance_for("float32", 4.3) == FP32_ATOL == 1e-4  # the built-in models' scale: the floor
    assert tolerance_for("float32", 34.5) == pytest.approx(6.9e-4) == FP32_REL_TOL * 34.5  # SmolLM2's


def test_bf16_checkpoint_computed_in_fp32_meets_fp32_tolerance(checkpoints, hf_dir):
    """The HF reference is loaded in the checkpoint dtype, so both sides hold the same rounded weights."""
    report = verify_checkpoint(checkpoints["bfloat16"], hf_dir, compute_dtype="float32")
    assert report.passed and report.max_abs_err < 1e-4


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_uses_documented_relative_tolerance(checkpoints, hf_dir, dtype):
    report = verify_checkpoint(checkpoints[dtype], hf_dir, compute_dtype=dtype)
    scale = report.max_abs_err / report.max_rel_err
    assert report.passed and report.compute_dtype == dtype
    assert report.tolerance == pytest.approx(LOW_PRECISION_REL_TOL[dtype] * scale)
    assert report.max_rel_err > 0  # the rounding differs, within the dtype's noise
    assert report.top1_agreement >= 0.9


@pytest.mark.parametrize("compute_dtype", ["float32", "bfloat16"])
def test_swapped_fc_and_gate_fails_without_raising(checkpoints, hf_dir, tmp_path, compute_dtype):
    broken = tmp_path / "broken"
    shutil.copytree(checkpoints["float32"], broken)
    for rank in range(4):
        tensors = load_file(broken / f"rank{rank}.safetensors")
        for name in [n for n in tensors if n.endswith("mlp.fc.weight")]:
            gate = name.replace("mlp.fc", "mlp.gate")
            tensors[name], tensors[gate] = tensors[gate], tensors[name]
        save_file(tensors, broken / f"rank{rank}.safetensors")
    report = verify_checkpoint(broken, hf_dir, compute_dtype=compute_dtype)
    assert not report.passed
    assert report.max_rel_err > 0.8 and report.top1_agreement < 0.5  # measured 1.05 and 0.14


def test_explicit_atol_and_prompts(checkpoints, hf_dir):
    report = verify_checkpoint(checkpoints["bfloat16"], hf_dir, prompts=[[0, VOCAB - 1, 7]],
                               compute_dtype="bfloat16", atol=0.0)
    assert report.num_tokens == 3 and report.tolerance == 0.0 and not report.passed


@pytest.mark.parametrize("kwargs, message", [
    ({"prompts": [[1, VOCAB]]}, r"prompt \[1, 1031\] is empty or holds ids outside \[0, 1031\)"),
    ({"prompts": [[]]}, r"is empty"),
    ({"compute_dtype": "int8"}, r"compute dtype 'int8' is not one of float32, bfloat16, float16"),
])
def test_bad_arguments(checkpoints, hf_dir, kwargs, message):
    with pytest.raises(KitUsageError, match=message):
        verify_checkpoint(checkpoints["float32"], hf_dir, **kwargs)


def test_checkpoint_of_another_model_is_refused(checkpoints, builtin):
    with pytest.raises(KitUsageError, match=r"was not converted from .*tiny-qwen2.*: architecture is "
                                            r"LlamaForCausalLM in the checkpoint but Qwen2ForCausalLM"):
        verify_checkpoint(checkpoints["float32"], builtin["tiny-qwen2"])


def test_nan_logits_fail(checkpoints, hf_dir, tmp_path):
    broken = tmp_path / "nan"
    shutil.copytree(checkpoints["float32"], broken)
    for rank in (2, 3):  # the last stage's two TP ranks hold the same ln_f
        tensors = load_file(broken / f"rank{rank}.safetensors")
        tensors["transformer.ln_f.weight"][0] = float("nan")
        save_file(tensors, broken / f"rank{rank}.safetensors")
    report = verify_checkpoint(broken, hf_dir)
    assert not report.passed and report.max_abs_err == float("inf")


def test_default_prompts_are_deterministic_and_in_vocab():
    prompts = default_prompts(VOCAB)
    assert prompts == default_prompts(VOCAB) != default_prompts(VOCAB, seed=1)
    assert [len(p) for p in prompts] == list(DEFAULT_PROMPT_LENGTHS)
    assert all(0 <= t < VOCAB for p in prompts for t in p)


def test_report_is_a_dataclass_with_json_friendly_dict():
    report = VerifyReport(0.5, 0.1, 0.75, 4, "bfloat16", 0.4, False)
    assert report.to_dict()["passed"] is False and report.to_dict()["max_abs_err"] == 0.5
