"""The frontend's ``lora_weights`` in the model's type: FP32 and FP16 as numpy casts them, BF16 as the 16-bit
patterns torch's round-to-nearest-even conversion gives (numpy has no bfloat16; Triton reads the raw bytes)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trtllm_kit.wire.lora import weights_as

VALUES = np.array([[0.0, -0.0, 1.0, -2.5, 3.14159, 1e-8, 65504.0, 1.00390625, 1.01171875, -7.3e5]], np.float32)


def test_bf16_bits_equal_torch() -> None:
    expected = torch.from_numpy(VALUES).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert weights_as(VALUES, "BF16").dtype == np.uint16
    assert np.array_equal(weights_as(VALUES, "BF16"), expected)


@pytest.mark.parametrize("datatype, dtype", [("FP32", np.float32), ("FP16", np.float16)])
def test_float_types_are_casts(datatype: str, dtype: type) -> None:
    assert np.array_equal(weights_as(VALUES, datatype), VALUES.astype(dtype))
