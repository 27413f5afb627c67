"""NVIDIA ModelOpt's INT4 AWQ of a built-in model, the oracle of the llmapi and engine AWQ tests
(``llmapi/test_awq_modelopt.py``, ``quant/test_awq_trtllm_modelopt.py``): ``INT4_AWQ_CFG`` (``awq_lite``) at a group
size, calibrated in bfloat16 on the kit's token windows, one window per forward pass with eager attention (as the
kit's layer-streamed CPU calibration runs).

Both modules compare against the same quantization of a model, group size and window count, so it is made once
per process (ModelOpt's search is most of either test's time) and kept unexported: each export is of a copy, as an
export may change the model it is given.
"""

from __future__ import annotations

import copy
import functools

import torch

from trtllm_kit.models.inspect import resolve_model_path
from trtllm_kit.quant.algos import QuantConfig
from trtllm_kit.quant.blocks import torch_threads
from trtllm_kit.quant.calib_data import token_windows

# The kit and ModelOpt reduce in different orders, so the AWQ search's losses tie differently at another thread
# count: the equality holds at the 2 threads these oracles were written on, whatever an earlier test set
# (``torch_threads(ORACLE_THREADS)``).
ORACLE_THREADS = 2


@functools.cache
def _quantized(model: str, group_size: int, samples: int, seq_len: int) -> torch.nn.Module:
    import modelopt.torch.quantization as mtq
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(model)
    windows = token_windows(path, QuantConfig(quant="int4-awq", calib_samples=samples, calib_seq_len=seq_len,
                                              awq_group_size=group_size))
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16, attn_implementation="eager")

    def forward_loop(module: torch.nn.Module) -> None:
        with torch.no_grad():
            for window in windows:
                module(torch.tensor([window]))

    recipe = copy.deepcopy(mtq.INT4_AWQ_CFG)
    for entry in recipe["quant_cfg"]:
        if entry["quantizer_name"] == "*weight_quantizer":
            entry["cfg"]["block_sizes"][-1] = group_size
    with torch_threads(ORACLE_THREADS):
        mtq.quantize(hf, recipe, forward_loop)
    return hf


def modelopt_awq(model: str, group_size: int, samples: int, seq_len: int) -> torch.nn.Module:
    """A private copy of the HF model as ModelOpt's INT4 AWQ quantizes it on ``samples`` windows of ``seq_len``
    tokens (the kit's ``token_windows``), made once per process for each set of arguments.

    Arguments:
        model: a model name the kit resolves (``builtin:tiny-llama``); group_size: input features per weight
        scale (128 or 64); samples, seq_len: the calibration windows.
    """
    return copy.deepcopy(_quantized(model, group_size, samples, seq_len))
