"""The unified checkpoint's INT4 AWQ tensors (ModelOpt's ``W4A16_AWQ``): per decoder linear ``weight`` (packed int4,
``[out/2, in]`` uint8), ``weight_scale`` (float32, ``[out, in/128]``) and, where no norm took the linear's scale,
``pre_quant_scale`` (``[in]`` in the checkpoint dtype); the norms before q/k/v and gate/up carry their group's
shared scale (``quant/awq_fold.py``).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import torch

from trtllm_kit.errors import KitUsageError
from trtllm_kit.quant.awq import GROUP_SIZE, group_scales, int4_pack
from trtllm_kit.quant.awq_fold import shares_input

if TYPE_CHECKING:
    from trtllm_kit.llmapi.unified import Entry

AWQ_NORM = re.compile(r"^model\.layers\.\d+\.(?:input|post_attention)_layernorm\.weight$")
F32 = torch.float32


def awq_entries(name: str, module: str, shape: tuple[int, ...], dtype: torch.dtype) -> list[Entry]:
    """The output tensors of one decoder linear.

    Arguments:
        name: the HF weight name; module: its module; shape: ``[out, in]``; dtype: the checkpoint dtype.
    """
    from trtllm_kit.llmapi.unified import Entry

    rows, cols = shape
    if cols % GROUP_SIZE or rows % 2:
        raise KitUsageError(f"--quant int4-awq packs two output rows per byte and scales groups of {GROUP_SIZE} "
                            f"input features, but {name} is {rows} x {cols}; choose --quant fp8 for this model.")
    entries = [Entry(name, torch.uint8, (rows // 2, cols), name, "int4"),
               Entry(f"{module}.weight_scale", F32, (rows, cols // GROUP_SIZE), name, "int4_scale")]
    if not shares_input(module):
        entries.append(Entry(f"{module}.pre_quant_scale", dtype, (cols,), name, "pre_quant_scale"))
    return entries


def awq_quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(packed, weight_scale)`` of a smoothed weight.

    Arguments:
        weight: ``[out, in]`` with its AWQ scale folded in (``AwqFold.weight``).
    """
    scales = group_scales(weight)
    return int4_pack(weight, scales), scales
