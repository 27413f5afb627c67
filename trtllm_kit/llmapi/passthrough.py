"""A pre-quantized checkpoint (``quant/prequantized.py``) as the llmapi target's ``checkpoint/``: checked against its
format, then its files copied as they are (by the kernel where it can), never de- or re-quantized."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from trtllm_kit.checkpoint.trtllm_config import resolve_dtype
from trtllm_kit.llmapi.quant_format import LAYER_LINEAR
from trtllm_kit.llmapi.unified import INDEX_FILE, UnifiedResult, copy_whole_file
from trtllm_kit.models.inspect import ModelSpec
from trtllm_kit.quant.prequantized import HF_QUANT_CONFIG, PreQuantized, check_prequantized

CONFIG_FILES = ("config.json", HF_QUANT_CONFIG, "generation_config.json")


def copy_prequantized(model: ModelSpec, out_dir: Path, fmt: PreQuantized) -> UnifiedResult:
    """Check ``model``'s quantized linears against ``fmt`` and copy its weight files, index and configs into the
    empty directory ``out_dir``.

    Arguments:
        model: the inspected pre-quantized model; out_dir: the new checkpoint directory; fmt: its format.
    """
    linears = [name for name in model.tensors if LAYER_LINEAR.match(name)]
    check_prequantized(fmt, model.tensors, linears)
    total = sum(copy_whole_file(path, out_dir / path.name) for path in model.weight_files)
    index = model.path / INDEX_FILE
    if index.is_file():
        shutil.copy2(index, out_dir / INDEX_FILE)
    else:
        weight_map = {name: info.path.name for name, info in model.tensors.items()}
        (out_dir / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total},
                                                      "weight_map": weight_map}, indent=2) + "\n")
    for name in CONFIG_FILES:
        if (model.path / name).is_file():
            shutil.copy2(model.path / name, out_dir / name)
    for path in model.tokenizer_files:
        if not (out_dir / path.name).exists():
            shutil.copy2(path, out_dir / path.name)
    return UnifiedResult(out_dir, resolve_dtype("auto", model.hf), tuple(out_dir / p.name for p in model.weight_files),
                         total, tuple(name.removesuffix(".weight") for name in linears))
