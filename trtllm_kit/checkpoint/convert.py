"""HF checkpoint → TensorRT-LLM checkpoint: the one streaming conversion loop.

Tensors are read one at a time from memory-mapped files and written straight into per-rank safetensors
files whose layout is fixed before any data moves, so peak memory follows the largest tensor.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from trtllm_kit.checkpoint.heads import heads_layout, iter_heads
from trtllm_kit.checkpoint.prequantized import PreQuantizedTransform
from trtllm_kit.checkpoint.prequantized_checks import check_trtllm_input
from trtllm_kit.checkpoint.shard import qkv_parts, shard
from trtllm_kit.checkpoint.tensor_reader import SourceRead, TensorReader, check_finite
from trtllm_kit.checkpoint.trtllm_config import checkpoint_config, resolve_dtype
from trtllm_kit.errors import CheckpointError, KitUsageError
from trtllm_kit.layout import QuantLayout, rank_tensors, stage_rules
from trtllm_kit.mapping import Mapping, check_tp
from trtllm_kit.models.base import Slice, Split, WorkItem, source_name
from trtllm_kit.models.inspect import ModelSpec, inspect_model
from trtllm_kit.quant.algos import QuantConfig, check_model
from trtllm_kit.quant.blocks import torch_threads
from trtllm_kit.quant.calibrate import CalibrationStats, calibrate
from trtllm_kit.quant.checkpoint import QuantTransform
from trtllm_kit.quant.prequantized import detect_prequantized
from trtllm_kit.safetensors_io import SafetensorsWriter
from trtllm_kit.spec.heads import SpeculativeHeads

TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
STORED_DTYPES = {**TORCH_DTYPES, "int8": torch.int8, "float8_e4m3fn": torch.float8_e4m3fn}  # layout names → torch
OnTensor = Callable[[str, int], None]
Layout = list[tuple[str, torch.dtype, tuple[int, ...]]]


class TensorTransform(Protocol):
    """A per-work-item hook (quantization): what each rank file holds instead of the plain tensor (the layout of
    which ``trtllm_kit.layout.rank_tensors`` states from the ``quantization`` object)."""

    @property
    def quantization(self) -> dict[str, Any]:
        """The ``quantization`` object of config.json."""

    def apply(self, item: WorkItem, shards: list[list[torch.Tensor]]) -> list[list[tuple[str, list[torch.Tensor]]]]:
        """Per TP rank, (name, parts) in ``entries`` order, from the plain per-rank parts."""

    def source_shape(self, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The stored shape of a source whose values have ``shape`` (packed input holds fewer rows)."""


@dataclass(frozen=True)
class ConvertResult:
    """What a conversion wrote."""

    out_dir: Path
    dtype: str
    mapping: Mapping
    rank_files: tuple[Path, ...]
    bytes_read: int


def work_items(model: ModelSpec, mapping: Mapping) -> list[WorkItem]:
    """Every tensor of every stage in file order: embedding, layers, final norm and lm_head."""
    rules = model.family.rules(model.hf)
    return [WorkItem(p.rule, p.layer, p.local_layer, pp_rank) for pp_rank in range(mapping.pp_size)
            for p in stage_rules(rules, model.hf.num_hidden_layers, mapping, pp_rank)]


def check_sources(model: ModelSpec, items: list[WorkItem], transform: TensorTransform | None = None) -> None:
    """Every source exists with the shape the config implies (as ``transform`` stores it); fails before anything
    is written."""
    shapes = model.family.hf_shapes(model.hf)
    for item in items:
        for pattern, name in zip(item.rule.sources, item.sources, strict=True):
            info = model.tensors.get(name)
            if info is None:
                raise CheckpointError(f"{model.path}: tensor {name} is missing from the weights; the checkpoint is "
                                 "incomplete or does not match its config.json.")
            expected = shapes[source_name(pattern)]
            if transform is not None:
                expected = transform.source_shape(name, expected)
            if info.shape != expected:
                raise CheckpointError(f"{info.path.name}: tensor {name} has shape {list(info.shape)}, but config.json "
                                 f"implies {list(expected)}; the weights and config do not match.")


def rank_entries(model: ModelSpec, mapping: Mapping, dtype: str, quantization: dict[str, Any] | None = None,
                 ) -> list[Layout]:
    """The (name, dtype, shape) layout of each rank file: ``rank_tensors`` in torch dtypes.

    Arguments:
        model: the inspected model; mapping: the layout; dtype: the resolved checkpoint dtype;
        quantization: the config's ``quantization`` object (None: unquantized).
    """
    quant = QuantLayout.from_dict(quantization)
    return [[(name, STORED_DTYPES[spec.dtype], spec.shape)
             for name, spec in rank_tensors(model.hf, model.family, mapping, rank, quant, dtype).items()]
            for rank in mapping.ranks()]


def iter_shards(model: ModelSpec, items: list[WorkItem], mapping: Mapping, dtype: str,
                read: Callable[[str, tuple[int, int] | None], torch.Tensor],
                ) -> Iterator[tuple[WorkItem, int, list[list[torch.Tensor]], list[SourceRead]]]:
    """Yield (item, bytes read, per TP rank the parts that concatenate along dim 0 to its tensor, and the
    sources as read, for ``check_finite`` and the kernel copy path).

    Each HF tensor (or slice of a fused one) is read once; the parts of q/k/v or of several column sources are
    not concatenated in memory but written one after another.

    Arguments:
        model: the inspected model.
        items: from ``work_items``.
        mapping: the TP/PP layout.
        dtype: the resolved checkpoint dtype.
        read: (HF tensor name, row range or None) → tensor (a ``TensorReader``, or meta tensors for shape tests).
    """
    target = TORCH_DTYPES[dtype]
    tp = mapping.tp_size
    for item in items:
        sources = []
        nbytes = 0
        for source in item.reads:
            rows = (source.start, source.stop) if isinstance(source, Slice) else None
            original = read(source_name(source), rows)
            nbytes += original.numel() * original.element_size()
            sources.append(SourceRead(source_name(source), original, original.to(target), rows))
        parts = [s.converted for s in sources]
        if item.rule.split is Split.QKV:
            shards = [qkv_parts(parts, model.hf.num_key_value_heads, tp, r) for r in range(tp)]
        else:
            shards = [[shard(p, item.rule.split, tp, r) for p in parts] for r in range(tp)]
        yield item, nbytes, shards, sources


def convert(model: ModelSpec, out_dir: Path, mapping: Mapping, dtype: str = "auto",
            on_tensor: OnTensor | None = None, transform: TensorTransform | None = None,
            heads: SpeculativeHeads | None = None) -> ConvertResult:
    """Write ``config.json`` and ``rank{N}.safetensors`` for ``model`` into ``out_dir`` (with speculative heads:
    their tensors in every rank file, ``checkpoint/heads.py``).

    Arguments:
        model: an inspected model.
        out_dir: an existing, empty directory (the caller makes the output atomic).
        mapping: the TP/PP layout.
        dtype: ``auto``, ``float16``, ``bfloat16`` or ``float32``.
        on_tensor: called with (tensor name, bytes read) after each tensor, for progress.
        transform: a quantization hook (``trtllm_kit.quant.checkpoint.QuantTransform``), or None.
        heads: speculative heads to write beside the base's weights (unquantized, in the checkpoint's dtype), or None.
    """
    hf = model.hf
    check_tp(hf.num_attention_heads, hf.num_key_value_heads, hf.intermediate_size, mapping.tp_size)
    dtype = resolve_dtype(dtype, hf)
    items = work_items(model, mapping)
    check_sources(model, items, transform)
    entries = rank_entries(model, mapping, dtype, transform.quantization if transform else None)
    if heads is not None:
        entries = [[*layout, *heads_layout(heads, mapping.tp_size, TORCH_DTYPES[dtype])] for layout in entries]
    paths = tuple(out_dir / f"rank{rank}.safetensors" for rank in range(mapping.world_size))
    total = 0
    with ExitStack() as stack:
        stack.enter_context(torch_threads(1))  # memory-bound work: a second intra-op thread only contends
        writers = [stack.enter_context(SafetensorsWriter(path, layout))
                   for path, layout in zip(paths, entries, strict=True)]
        reader = TensorReader(model, stack)
        # Each tensor is checked for NaN/Inf on a second thread while the next one is written, so the two
        # threads never fault the same memory-mapped pages (a tensor copied file to file by the kernel is not
        # paged into this process at all before its check). A bad tensor stops the conversion one tensor later,
        # and the caller removes the staging directory it was written to.
        checker = stack.enter_context(ThreadPoolExecutor(max_workers=1, thread_name_prefix="finite-check"))
        checking: list[Future[None]] = []
        for item, nbytes, shards, sources in iter_shards(model, items, mapping, dtype, reader.read):
            locate = reader.locator(sources)
            outputs = transform.apply(item, shards) if transform else [[(item.target, parts)] for parts in shards]
            for tp_rank, tensors in enumerate(outputs):
                for name, parts in tensors:
                    writers[mapping.rank(tp_rank, item.pp_rank)].write(name, parts, locate)
            while checking:
                checking.pop().result()
            checking = [checker.submit(check_finite, s.name, s.original, s.converted, dtype) for s in sources]
            total += nbytes
            if on_tensor:
                on_tensor(item.target, nbytes)
        while checking:
            checking.pop().result()
        for row, original, converted in iter_heads(heads, TORCH_DTYPES[dtype], reader.read) if heads else ():
            check_finite(row.name, original, converted, dtype)
            for rank in mapping.ranks():
                writers[rank].write(row.name, shard(converted, row.split, mapping.tp_size, mapping.tp_rank(rank)))
            total += original.numel() * original.element_size()
    config = checkpoint_config(hf, model.family, mapping, dtype, transform.quantization if transform else None)
    (out_dir / "config.json").write_text(json.dumps(config, indent=4) + "\n")
    return ConvertResult(out_dir, dtype, mapping, paths, total)


def convert_checkpoint(hf_dir: Path | str, out_dir: Path, *, tp_size: int = 1, pp_size: int = 1,
                       dtype: str = "auto", allow_pickle: bool = False, quant: QuantConfig | None = None,
                       stats: CalibrationStats | None = None) -> ConvertResult:
    """Inspect and convert in one call (the library entry point for scripts and tests).

    Arguments:
        hf_dir: a model directory, ``builtin:NAME`` or a cached repo id.
        out_dir: the checkpoint directory to create (must not hold files).
        tp_size: tensor-parallel size.
        pp_size: pipeline-parallel size.
        dtype: ``auto``, ``float16``, ``bfloat16`` or ``float32``.
        allow_pickle: accept pickle weights.
        quant: the quantization (none when omitted).
        stats: calibration statistics; calibrated here on the shipped corpus when the quantization needs them.
    """
    model = inspect_model(str(hf_dir), allow_pickle=allow_pickle)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    mapping = Mapping(tp_size, pp_size)
    return convert(model, out_dir, mapping, dtype, transform=quant_transform(model, mapping, dtype, quant, stats))


def quant_transform(model: ModelSpec, mapping: Mapping, dtype: str, quant: QuantConfig | None,
                    stats: CalibrationStats | None = None) -> TensorTransform | None:
    """The quantization hook for ``convert`` (None when nothing is quantized), calibrating when needed; a
    pre-quantized input's hook carries its quantization over instead (``checkpoint/prequantized.py``).

    Arguments:
        model: the inspected model; mapping: the layout; dtype: the requested dtype; quant: the quantization;
        stats: calibration statistics, or None to calibrate now when the quantization needs them.
    """
    rules = model.family.rules(model.hf)
    fmt = detect_prequantized(model.path)
    if fmt is not None:
        check_trtllm_input(fmt, model, quant or QuantConfig())
        return PreQuantizedTransform(model, fmt, rules, TORCH_DTYPES[resolve_dtype(dtype, model.hf)])
    if quant is None or not quant.is_quantized:
        return None
    if quant.needs_calibration and any(isinstance(s, Slice) for rule in rules for s in rule.sources):
        raise KitUsageError(f"--quant {quant.quant} --kv-cache {quant.kv_cache} needs calibration statistics per "
                            f"q/k/v and gate/up projection, which {model.family.name}'s fused HF projections do not "
                            "give; use --quant int8-wo or none with --kv-cache auto.")
    check_model(quant, model.hf, mapping.tp_size)
    if quant.needs_calibration and stats is None:
        stats = calibrate(model.path, quant)
    target = TORCH_DTYPES[resolve_dtype(dtype, model.hf)]
    return QuantTransform(quant, rules, target, stats)
