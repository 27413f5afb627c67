"""The unified checkpoint's INT4 AWQ tensors (ModelOpt's ``W4A16_AWQ``): per decoder linear ``weight`` (packed int4,
``[out/2, in]`` uint8), ``weight_scale`` (float32, ``[out, in/group]``, ``--awq-group-size``) and, where no norm
took the linear's scale, ``pre_quant_scale`` (``[in]`` in the checkpoint dtype); the norms before q/k/v and
gate/up carry their group's shared scale (``quant/awq_fold.py``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from concurrent.futures import Executor

import torch

from trtllm_kit.errors import KitUsageError
from trtllm_kit.layout import AWQ_GROUP_SIZE
from trtllm_kit.llmapi.entry import Entry
from trtllm_kit.quant.awq import group_scales, int4_pack
from trtllm_kit.quant.awq_fold import shares_input

AWQ_NORM = re.compile(r"^model\.layers\.\d+\.(?:input|post_attention)_layernorm\.weight$")
F32 = torch.float32
BLOCK_ELEMENTS = 1 << 18  # weight elements per block: its float32 quotients (1 MiB) stay in cache


def awq_entries(name: str, module: str, shape: tuple[int, ...], dtype: torch.dtype,
                group_size: int = AWQ_GROUP_SIZE) -> list[Entry]:
    """The output tensors of one decoder linear.

    Arguments:
        name: the HF weight name; module: its module; shape: ``[out, in]``; dtype: the checkpoint dtype;
        group_size: input features per weight scale.
    """
    rows, cols = shape
    if cols % group_size or rows % 2:
        raise KitUsageError(f"--quant int4-awq packs two output rows per byte and scales groups of {group_size} "
                            f"input features, but {name} is {rows} x {cols}; choose --quant fp8 for this model.")
    entries = [Entry(name, torch.uint8, (rows // 2, cols), name, "int4"),
               Entry(f"{module}.weight_scale", F32, (rows, cols // group_size), name, "int4_scale")]
    if not shares_input(module):
        entries.append(Entry(f"{module}.pre_quant_scale", dtype, (cols,), name, "pre_quant_scale"))
    return entries


def awq_quantize(weight: torch.Tensor, fold: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 pool: Executor | None = None, workers: int = 1,
                 group_size: int = AWQ_GROUP_SIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """``(packed, weight_scale)`` of a weight with its AWQ scale folded in, a block of rows at a time (the fold
    and the quantization are per row, so the bytes are those of the whole weight at once), the blocks split into
    ``workers`` ranges run on ``pool``.

    Arguments:
        weight: ``[out, in]`` in the checkpoint dtype; fold: the rows with their scale folded in
        (``AwqFold.weight``), None when ``weight`` already is; pool: threads (None: the calling thread);
        workers: how many ranges; group_size: input features per weight scale.
    """
    rows, cols = weight.shape
    packed = torch.empty((rows // 2, cols), dtype=torch.uint8)
    scales = torch.empty((rows, cols // group_size), dtype=F32)
    per_block = max(2, BLOCK_ELEMENTS // cols // 2 * 2)  # an even number of rows: two per packed byte row
    starts = list(range(0, rows, per_block))

    def run(chunk: list[int]) -> None:
        for start in chunk:
            stop = min(rows, start + per_block)
            smoothed = weight[start:stop] if fold is None else fold(weight[start:stop])
            scales[start:stop] = group_scales(smoothed, group_size)
            packed[start // 2:stop // 2] = int4_pack(smoothed, scales[start:stop])

    count = max(1, min(workers, len(starts))) if pool is not None else 1
    size = -(-len(starts) // count)
    if count == 1:
        run(starts)
    else:
        assert pool is not None, "count > 1 needs a pool"
        for done in [pool.submit(run, starts[i:i + size]) for i in range(0, len(starts), size)]:
            done.result()
    return packed, scales
