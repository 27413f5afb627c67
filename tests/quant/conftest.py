"""Shared fixtures: the built-in tiny models and their calibration statistics (small, seeded calibration)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.quant.algos import QuantConfig
from trtllm_kit.quant.calibrate import CalibrationStats, calibrate

CALIB = {"calib_samples": 16, "calib_seq_len": 128, "calib_dtype": "float32"}


@pytest.fixture(scope="session")
def tiny() -> dict[str, Path]:
    return {name: builtin_dir(name) for name in ("tiny-llama", "tiny-mistral", "tiny-qwen2")}


@pytest.fixture(scope="session")
def stats(tiny: dict[str, Path]) -> dict[str, CalibrationStats]:
    torch.set_num_threads(1)
    return {name: calibrate(path, QuantConfig(quant="fp8", **CALIB)) for name, path in tiny.items()}
