"""HF checkpoint → the llmapi target's ``checkpoint/``: one unsharded, unfused Hugging Face directory as
TensorRT-LLM's PyTorch backend loads it (``HfWeightLoader``; TP/PP are applied at load time).

Each input safetensors file becomes one output shard with the same tensors in the same order, listed in
``model.safetensors.index.json``. A tensor kept in its dtype is copied file to file by the kernel (the
converter's ``SafetensorsWriter``); with ``--quant fp8`` every decoder linear becomes e4m3 weights plus
float32 scalar ``weight_scale`` and ``input_scale`` (ModelOpt's unified format), with ``--quant nvfp4`` packed
e2m1 weights plus e4m3 block ``weight_scale``, float32 ``weight_scale_2`` and ``input_scale``
(``quant/nvfp4.py``), with ``--quant int4-awq`` packed int4 weights, float32 group ``weight_scale`` and
``pre_quant_scale`` where no norm took it (``llmapi/awq_entries.py``), and ``--kv-cache fp8`` adds
``k_proj.k_scale`` / ``v_proj.v_scale``. ``config.json`` (dtype and ``quantization_config`` updated),
``generation_config.json``, ``hf_quant_config.json`` and the tokenizer files complete the directory.
"""

from __future__ import annotations

import json
import shutil
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from trtllm_kit.checkpoint.convert import TORCH_DTYPES
from trtllm_kit.checkpoint.tensor_reader import SourceRead, TensorReader, check_finite
from trtllm_kit.checkpoint.trtllm_config import resolve_dtype
from trtllm_kit.errors import CheckpointError
from trtllm_kit.llmapi.awq_entries import awq_quantize
from trtllm_kit.llmapi.entry import Entry
from trtllm_kit.llmapi.quant_format import (
    QUANT_CONFIG_FILE,
    activation_scale,
    check_llmapi_quant,
    fused_group,
    hf_quant_config,
    inline_quantization_config,
    quantize_weight,
    weight_scale,
)
from trtllm_kit.llmapi.shard_entries import plan_entries, shard_names
from trtllm_kit.models.inspect import ModelSpec
from trtllm_kit.quant.algos import QuantConfig
from trtllm_kit.quant.awq_fold import AwqFold
from trtllm_kit.quant.blocks import default_workers, torch_threads
from trtllm_kit.quant.calibrate import CalibrationStats
from trtllm_kit.quant.nvfp4 import global_scale, nvfp4_quantize_rows
from trtllm_kit.safetensors_io import FileSlice, SafetensorsWriter, copy_slice, read_layout, write_all

INDEX_FILE = "model.safetensors.index.json"
F32 = torch.float32
OnTensor = Any  # (name, bytes read) -> None


@dataclass(frozen=True)
class UnifiedResult:
    """What the export wrote."""

    out_dir: Path
    dtype: str
    files: tuple[Path, ...]
    bytes_read: int
    quantized_modules: tuple[str, ...]


def _scale(entry: Entry, stats: CalibrationStats | None) -> torch.Tensor:
    assert stats is not None, "write_unified refuses a calibrated quantization without statistics"
    module = entry.source.removesuffix(".weight")
    if entry.kind == "weight_scale":
        return weight_scale(stats.get("w", module).max())
    if entry.kind == "input_scale":
        return activation_scale(stats.get("x", module).max())
    if entry.kind in ("weight_scale_2", "nvfp4_input_scale"):  # one amax for the linears fused with it
        kind = "w" if entry.kind == "weight_scale_2" else "x"
        return global_scale(torch.stack([stats.get(kind, m).max() for m in fused_group(module)]).max())
    output = stats.get("y", module)  # k_scale / v_scale: amax of the k / v projection output
    return activation_scale((output if entry.rows is None else output[entry.rows[0]:entry.rows[1]]).max())


def write_unified(model: ModelSpec, out_dir: Path, dtype: str = "auto", quant: QuantConfig | None = None,
                  stats: CalibrationStats | None = None, on_tensor: OnTensor | None = None) -> UnifiedResult:
    """Write the unified checkpoint of ``model`` into the empty directory ``out_dir``.

    A shard whose tensors are all kept as they are is the input file copied whole by the kernel (its header
    checked first); a tensor kept in its dtype inside a shard that changes is a kernel copy of its bytes. Neither
    is checked for NaN/Inf (the bytes are the input's, which the backend would load as they are; README "Target
    llmapi"); a dtype conversion is checked (float16 can overflow) and so is every FP8 weight, in the same pass.

    Arguments:
        model: the inspected HF model; out_dir: an existing empty directory (the caller makes it atomic);
        dtype: ``auto`` or a dtype; quant: the quantization (none when omitted); stats: calibration statistics
        (needed for FP8 weights or an FP8 KV cache); on_tensor: progress, called with (name, bytes read).
    """
    quant = quant or QuantConfig()
    check_llmapi_quant(quant)
    if quant.needs_calibration and stats is None:
        raise CheckpointError(f"--quant {quant.quant} --kv-cache {quant.kv_cache} needs calibration statistics.")
    resolved = resolve_dtype(dtype, model.hf)
    target = TORCH_DTYPES[resolved]
    plans = plan_entries(model, target, quant)
    names = shard_names(len(plans))
    weight_map: dict[str, str] = {}
    total, quantized = 0, []
    workers = default_workers()
    fold = AwqFold(stats, target) if quant.quant_algo == "W4A16_AWQ" and stats is not None else None
    with ExitStack() as stack:
        stack.enter_context(torch_threads(1))  # the FP8 blocks run on their own threads, one intra-op thread each
        reader = TensorReader(model, stack)
        checker = stack.enter_context(ThreadPoolExecutor(max_workers=1, thread_name_prefix="finite-check"))
        pool = stack.enter_context(ThreadPoolExecutor(max_workers=workers, thread_name_prefix="quant-block"))
        writes = stack.enter_context(ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-write"))
        checking: list[Future[None]] = []
        for source_file, file_name, entries in zip(model.weight_files, names, plans, strict=True):
            weight_map.update(dict.fromkeys((e.name for e in entries), file_name))
            if _unchanged(model, source_file, entries):
                nbytes = copy_whole_file(source_file, out_dir / file_name)
                total += nbytes
                if on_tensor:
                    on_tensor(file_name, nbytes)
                continue
            layout = [(e.name, e.dtype, e.shape) for e in entries]
            with SafetensorsWriter(out_dir / file_name, layout, metadata={"format": "pt"}) as writer:
                # Writes go to one thread, at most two behind, so the block threads quantize the next weight
                # while the last one is written; every write has ended before the file is closed.
                pending: list[Future[None]] = []

                def write(*args: Any, writer: SafetensorsWriter = writer, pending: list = pending) -> None:
                    pending.append(writes.submit(writer.write, *args))
                    while len(pending) > 2:
                        pending.pop(0).result()

                block_scales: dict[str, torch.Tensor] = {}  # NVFP4, AWQ: the weight's scales, written next
                try:
                    for entry in entries:
                        if entry.kind in ("block_scale", "int4_scale"):
                            write(entry.name, block_scales.pop(entry.source))
                            continue
                        if entry.kind == "pre_quant_scale":
                            assert fold is not None, "AWQ entries exist only with a fold"
                            write(entry.name, fold.shared_scale(entry.source.removesuffix(".weight")))
                            continue
                        if entry.kind not in ("copy", "fp8", "nvfp4", "int4", "awq_norm"):
                            write(entry.name, _scale(entry, stats).reshape(entry.shape))
                            continue
                        original = reader.read(entry.source)
                        if entry.kind == "awq_norm":
                            assert fold is not None, "AWQ entries exist only with a fold"
                            write(entry.name, fold.norm(entry.source.removesuffix(".weight"), original))
                        elif entry.kind == "int4":
                            assert fold is not None, "AWQ entries exist only with a fold"
                            module = entry.source.removesuffix(".weight")
                            packed, scales = awq_quantize(original.to(target), partial(fold.weight, module), pool,
                                                          workers, quant.awq_group_size)
                            if not bool(scales.isfinite().all()):  # a NaN/Inf weight makes its group's scale one
                                check_finite(entry.source, original, original, resolved)
                            block_scales[entry.source] = scales
                            write(entry.name, packed)
                            quantized.append(module)
                        elif entry.kind == "nvfp4":
                            scale_2 = _scale(Entry(entry.name, F32, (), entry.source, "weight_scale_2"), stats)
                            weight = original.to(target)
                            if not bool(weight.isfinite().all()):
                                check_finite(entry.source, original, original, resolved)
                            packed, block_scales[entry.source] = nvfp4_quantize_rows(weight, scale_2, pool, workers)
                            write(entry.name, packed)
                            quantized.append(entry.source.removesuffix(".weight"))
                        elif entry.kind == "fp8":
                            assert stats is not None, "checked above: FP8 needs calibration statistics"
                            module = entry.source.removesuffix(".weight")
                            scale = weight_scale(stats.get("w", module).max())
                            fd, offset = writer.claim(entry.name, entry.dtype, entry.shape)
                            row = original.numel() // max(1, original.shape[0])  # e4m3: one byte per element

                            def sink(start: int, rows: torch.Tensor, fd: int = fd, offset: int = offset,
                                     row: int = row) -> None:  # on the block's thread, the rows still in cache
                                write_all(fd, rows.view(torch.uint8).numpy().data.cast("B"),
                                          offset + start * row)

                            _, finite = quantize_weight(original.to(target), scale, pool, workers, sink)
                            if not finite:  # NaN/Inf in the source, or a stale scale that overflowed: say which
                                check_finite(entry.source, original, original, resolved)
                            quantized.append(module)
                        elif original.dtype == entry.dtype:
                            write(entry.name, original, reader.locator([SourceRead(entry.source, original,
                                                                                   original, None)]))
                        else:
                            converted = original.to(entry.dtype)
                            write(entry.name, converted)
                            while checking:  # one tensor behind, on another thread (see convert.convert)
                                checking.pop().result()
                            checking = [checker.submit(check_finite, entry.source, original, converted, resolved)]
                        nbytes = original.numel() * original.element_size()
                        total += nbytes
                        if on_tensor:
                            on_tensor(entry.name, nbytes)
                finally:
                    wait(pending)
                for done in pending:
                    done.result()
        while checking:
            checking.pop().result()
    index = {"metadata": {"total_size": sum((out_dir / n).stat().st_size for n in names)}, "weight_map": weight_map}
    (out_dir / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    _write_configs(model, out_dir, resolved, quant)
    return UnifiedResult(out_dir, resolved, tuple(out_dir / n for n in names), total, tuple(quantized))


def _unchanged(model: ModelSpec, source_file: Path, entries: list[Entry]) -> bool:
    """Whether the output shard is ``source_file`` as it is: safetensors, every tensor of it kept in its dtype
    (none dropped, none added)."""
    if model.weight_format != "safetensors":
        return False
    in_file = [name for name, info in model.tensors.items() if info.path == source_file]
    return len(in_file) == len(entries) and all(
        e.kind == "copy" and e.name == e.source and model.tensors[e.source].dtype == e.dtype for e in entries)


def copy_whole_file(source: Path, dest: Path) -> int:
    """Copy a safetensors file as it is (by the kernel where it can), after checking its header against its
    size; returns the bytes of tensor data.

    Arguments:
        source: the input shard; dest: the new file.
    """
    _header, data_start = read_layout(source)
    size = source.stat().st_size
    with source.open("rb") as src, dest.open("wb") as dst:
        if not copy_slice(FileSlice(src.fileno(), 0, size), dst.fileno(), 0):
            shutil.copyfileobj(src, dst, 16 << 20)
    if dest.stat().st_size != size:
        raise CheckpointError(f"{source.name} changed while it was copied ({size} bytes before, "
                              f"{dest.stat().st_size} copied); build again.")
    return size - data_start


def _write_configs(model: ModelSpec, out_dir: Path, dtype: str, quant: QuantConfig) -> None:
    """config.json (dtype, inline quantization), generation_config.json, hf_quant_config.json, tokenizer files."""
    config = dict(model.hf.raw)
    config["dtype" if "dtype" in config and "torch_dtype" not in config else "torch_dtype"] = dtype
    config.pop("quantization_config", None)
    if quant.is_quantized:
        config["quantization_config"] = inline_quantization_config(quant)
        (out_dir / QUANT_CONFIG_FILE).write_text(json.dumps(hf_quant_config(quant), indent=2) + "\n")
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for path in model.tokenizer_files:
        shutil.copy2(path, out_dir / path.name)
    if not (out_dir / "generation_config.json").is_file():
        generation: dict[str, Any] = {"_from_model_config": True}
        if model.hf.bos_token_id is not None:
            generation["bos_token_id"] = model.hf.bos_token_id
        if model.hf.eos_token_ids:
            eos = list(model.hf.eos_token_ids)
            generation["eos_token_id"] = eos[0] if len(eos) == 1 else eos
        (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
