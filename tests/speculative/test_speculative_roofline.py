"""Speculation by batch size: the GPU table's roofline figures, the knee of a build (``spec/roofline.py``) and the
speedup at batch sizes 1, 4 and 16 with the batch size at which it stops paying, against values computed by hand;
a board without figures is reported as not known."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtllm_kit.cli import run
from trtllm_kit.gpus import GPU_TABLE, gpu_from_table, resolve_gpu
from trtllm_kit.precision import Precision
from trtllm_kit.spec.roofline import roofline
from trtllm_kit.spec.speculative_speedup import ROOFLINE_NOTE, roofline_report, stops_paying_at

H100 = gpu_from_table("H100-80GB")
H100_KNEE = 989.5e12 / 3.35e12  # FLOP/s over bytes/s: FLOPs a byte; x 2 bytes a weight / 2 FLOPs a weight and token


def test_the_h100_row_holds_the_datasheets_dense_figures() -> None:
    """NVIDIA's H100 SXM column prints 1,979 (FP16/BF16) and 3,958 (FP8, INT8) with sparsity: half of those."""
    board = GPU_TABLE["H100-80GB"]
    assert (board.memory_bandwidth, board.fp16_flops, board.fp8_flops, board.int8_ops) == \
        (3.35e12, 1979e12 / 2, 3958e12 / 2, 3958e12 / 2)
    assert GPU_TABLE["A100-80GB"].fp8_flops is None  # Ampere has no FP8 tensor cores


@pytest.mark.parametrize(("precision", "tensor_cores", "knee"), [
    (Precision("bfloat16"), "bfloat16", H100_KNEE * 2 / 2),
    (Precision("bfloat16", "FP8"), "fp8", 1979e12 / 3.35e12 * 1 / 2),  # twice the FLOPs, half the bytes: the same
    (Precision("float16", "W8A16"), "float16", H100_KNEE * 1 / 2),  # FP16 math on int8 weights
    (Precision("float16", "W4A16_AWQ"), "float16", H100_KNEE * 0.5 / 2),
    (Precision("float16", "W8A8_SQ_PER_CHANNEL_PLUGIN"), "int8", 1979e12 / 3.35e12 * 1 / 2),
])
def test_the_knee_is_flops_over_bandwidth_times_bytes_per_weight_over_two(precision: Precision, tensor_cores: str,
                                                                          knee: float) -> None:
    found = roofline(H100, precision)
    assert found.tensor_cores == tensor_cores
    assert found.knee_tokens == pytest.approx(knee)
    assert found.unknown is None


def test_the_speedup_by_batch_size_on_an_h100_with_4_bit_weights() -> None:
    """W4A16 AWQ on an H100: knee = 295.37 x 0.5 / 2 = 73.84 tokens. K = 4, prompt lookup (c = 0): batches 1 and 4
    verify 5 and 20 tokens, memory-bound (the speedup is L); batch 16 verifies 80 tokens, 80 / 73.84 = 1.0834 plain
    steps for one plain step of 16. It stops paying where L / (5 b / 73.84) < 1: b > 14.77 L."""
    report = roofline_report(roofline(H100, Precision("float16", "W4A16_AWQ")), draft_len=4, draft_cost=0.0)
    assert report["knee_tokens"] == 73.8
    assert report["predicted_speedup_by_batch_size"] == {
        "1": {"1.5": 1.5, "2": 2.0, "3": 3.0, "4": 4.0},
        "4": {"1.5": 1.5, "2": 2.0, "3": 3.0, "4": 4.0},
        "16": {"1.5": 1.385, "2": 1.846, "3": 2.769, "4": 3.692}}  # L / 1.0834
    assert report["stops_paying_at_batch_size"] == {"1.5": 23, "2": 30, "3": 45, "4": 60}  # 22.2, 29.5, 44.3, 59.1
    assert report["model"] == ROOFLINE_NOTE and "no attention, no kernel efficiency" in ROOFLINE_NOTE


def test_a_draft_model_stops_paying_sooner() -> None:
    """c = 0.1, K = 4, knee 100: L / 1.4 while 5 b <= 100; then L / (5 b / 100 + 0.4), below 1 once b > 20 L - 8
    (L = 2: exactly 1 at 32, below from 33); past the knee L / 5.4, below 1 for every L up to K + 1 = 5."""
    assert stops_paying_at(2.0, 4, 0.1, 100.0) == 33
    assert stops_paying_at(1.2, 4, 0.1, 100.0) == 1  # below 1 + K c = 1.4: loses already at batch 1
    assert stops_paying_at(5.0, 4, 0.0, 100.0) is None  # every draft kept, no draft cost: never below 1
    assert stops_paying_at(5.0, 4, 0.0, H100_KNEE) is None  # 5 x 1.0021 / 5.0106: 1 but for float rounding
    assert stops_paying_at(2.32, 4, 0.0, H100_KNEE) == 138  # the README's prompt lookup: b > 2.32 x 295.37 / 5
    assert stops_paying_at(2.0, 4, 0.0, None) is None  # no knee: memory-bound at every size


def _plan(tmp_path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    assert run(["plan", "builtin:tiny-llama", "--target", "cpu", "--out", str(tmp_path / "out"), "--speculative",
                "ngram", "--max-draft-len", "4", *flags]) == 0
    return capsys.readouterr().out


def test_the_plan_predicts_prompt_lookup_by_batch_size_on_an_h100(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """tiny-llama is bfloat16: knee 295.37 tokens; 16 x 5 = 80 verified tokens stay memory-bound (the speedup is L at
    1, 4 and 16); it stops paying where L / (5 b / 295.37) < 1: b > 59.07 L."""
    entry = json.loads(_plan(tmp_path, capsys, "--gpu", "H100", "--json"))["speculation"]["roofline"]
    assert entry == {"gpu": "H100-80GB", "tensor_cores": "bfloat16", "peak_flops": 989.5e12,
                     "memory_bandwidth": 3.35e12, "bytes_per_weight": 2.0, "knee_tokens": 295.4,
                     "predicted_speedup_by_batch_size": {str(b): {"1.5": 1.5, "2": 2.0, "3": 3.0, "4": 4.0}
                                                         for b in (1, 4, 16)},
                     "stops_paying_at_batch_size": {"1.5": 89, "2": 119, "3": 178, "4": 237},  # 88.6, 118.1, ...
                     "unknown": None, "model": ROOFLINE_NOTE}
    printed = _plan(tmp_path, capsys, "--gpu", "H100")
    assert "a step turns compute-bound at 295.4 tokens" in printed
    assert "\n  batch 16: 1.5: 1.50x, 2: 2.00x, 3: 3.00x, 4: 4.00x\n" in printed
    assert "stops paying (below 1x) from batch size, by acceptance length: 1.5: 89, 2: 119, 3: 178, 4: 237" in printed
    assert "no attention, no kernel efficiency" in printed


@pytest.mark.parametrize(("flags", "gpu", "missing"), [
    (["--gpu", "A10G"], "A10G", "FP16/BF16 tensor-core FLOP/s or memory bandwidth"),  # no NVIDIA datasheet
    (["--gpu-memory", "80"], "80 GiB GPU", "FP16/BF16 tensor-core FLOP/s or memory bandwidth"),  # not a board
])
def test_a_gpu_without_figures_is_not_predicted_by_batch_size(flags: list[str], gpu: str, missing: str, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    report = json.loads(_plan(tmp_path, capsys, *flags, "--json"))["speculation"]
    message = f"the GPU table holds no {missing} for {gpu}, so the plan does not know where a step turns compute-bound"
    assert report["predicted_speedup"] == {"1.5": 1.5, "2": 2.0, "3": 3.0, "4": 4.0}  # batch 1 stays
    assert {key: report["roofline"][key] for key in ("knee_tokens", "predicted_speedup_by_batch_size",
                                                     "stops_paying_at_batch_size", "unknown")} == \
        {"knee_tokens": None, "predicted_speedup_by_batch_size": None, "stops_paying_at_batch_size": None,
         "unknown": message}
    assert f"Speculation by batch size on {gpu}: not predicted: {message}; the speedups above are batch 1's" in \
        _plan(tmp_path, capsys, *flags)


def test_fp8_on_a_board_without_fp8_tensor_cores_names_the_missing_figure() -> None:
    a100 = resolve_gpu("A100", None, [])
    assert a100 is not None
    assert roofline(a100, Precision("bfloat16", "FP8")).unknown == (
        "the GPU table holds no FP8 tensor-core FLOP/s for A100-80GB, so the plan does not know where a step turns "
        "compute-bound")
