"""One output tensor of the unified checkpoint export, as planned before any byte is read: what ``unified.py`` writes
and the planners (``shard_entries.py``, ``awq_entries.py``) return.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Entry:
    """One output tensor: its name, dtype and shape, the HF tensor it comes from and how (``copy``, ``fp8``,
    ``weight_scale``, ``input_scale``, ``k_scale``, ``v_scale``; NVFP4: ``nvfp4``, ``block_scale``,
    ``weight_scale_2``, ``nvfp4_input_scale``; AWQ: ``int4``, ``int4_scale``, ``pre_quant_scale``, ``awq_norm``)."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    source: str
    kind: str
    rows: tuple[int, int] | None = None  # the output rows a k_scale / v_scale reads (of a fused qkv_proj)
