"""Loading a model with ``transformers`` for calibration and numerical checks: local, no remote code."""

from __future__ import annotations

from pathlib import Path

import torch


def load_causal_lm(model_dir: Path, dtype: torch.dtype) -> torch.nn.Module:
    """The HF causal LM in ``dtype`` in eval mode, with eager attention and no progress bar of its own.

    ``dtype=`` is the keyword of transformers 4.56 and newer (5.x dropped ``torch_dtype``); the kit requires
    4.56, which NVIDIA's TensorRT-LLM 1.2.1 container (4.57) satisfies.

    Arguments:
        model_dir: a local HF model directory.
        dtype: the weights' dtype after loading.
    """
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # the kit reports its own progress; a second bar would interleave
    try:
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype, attn_implementation="eager",
                                                     trust_remote_code=False)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return model.eval()
