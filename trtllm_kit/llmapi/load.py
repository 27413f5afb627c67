"""The unified checkpoint loaded the way TensorRT-LLM's PyTorch backend loads it, for the CPU runtime.

The backend shards at load time (column/row splits of each HF tensor, KV heads duplicated when fewer than
tp), fuses q/k/v and gate/up, and for FP8 gives a fused linear the largest of its parts' ``weight_scale`` and
``input_scale``, rescaling each part's e4m3 weights to it in the model dtype (``FP8QDQLinearMethod``,
``quant/fp8.py`` ``fp8_fused``); an FP8 KV cache runs with
unit scales, whatever ``k_scale``/``v_scale`` say. NVFP4 weights are dequantized (``e2m1 · weight_scale ·
weight_scale_2``, float32) and run as plain linears; so are W4A16 AWQ weights (``code · weight_scale``,
times ``pre_quant_scale`` per input channel where the checkpoint has one). The result here is the same per-rank
tensors in the CPU runtime's layout (``CheckpointModel``), so its TP partial sums and PP stages run as the GPUs
would.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Container
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open

from trtllm_kit.artifact import Artifact
from trtllm_kit.checkpoint.convert import work_items
from trtllm_kit.checkpoint.shard import qkv_parts, shard
from trtllm_kit.checkpoint.trtllm_config import checkpoint_config, default_quantization, resolve_dtype
from trtllm_kit.errors import CheckpointError
from trtllm_kit.llmapi.quant_format import LAYER_LINEAR
from trtllm_kit.mapping import Mapping, check_tp
from trtllm_kit.models.base import Slice, Source, Split
from trtllm_kit.models.inspect import inspect_model
from trtllm_kit.quant.awq import int4_dequantize
from trtllm_kit.quant.fp8 import FP8_DTYPE, fp8_fused
from trtllm_kit.quant.nvfp4 import nvfp4_dequantize
from trtllm_kit.quant.prequantized import detect_prequantized
from trtllm_kit.runtime.layers import LINEAR_WEIGHTS, prepare_weights
from trtllm_kit.runtime.model import CheckpointModel

F32 = torch.float32
# TensorRT-LLM modules whose HF parts share one FP8 scale when fused (gate_up: fc and gate read both)
FUSED_PARTS = {"mlp.fc": ("gate_proj", "up_proj"), "mlp.gate": ("gate_proj", "up_proj")}
DEQUANTIZED = ("NVFP4", "W4A16_AWQ")  # formats whose weights the loader dequantizes to float32 plain linears


def read_quantization(ckpt_dir: Path) -> tuple[str | None, str | None]:
    """(``quant_algo``, ``kv_cache_quant_algo``) of a unified checkpoint, from ``hf_quant_config.json`` or
    ``config.json``'s ``quantization_config`` (ModelOpt's or compressed-tensors', ``quant/prequantized.py``).

    Arguments:
        ckpt_dir: the checkpoint directory.
    """
    fmt = detect_prequantized(ckpt_dir)
    if fmt is None:
        return None, None
    if fmt.quant_algo not in DEQUANTIZED and (fmt.quant_algo != "FP8" or fmt.strategy != "tensor"):
        raise CheckpointError(f"{ckpt_dir} is {fmt.label} ({fmt.declared_in}); the CPU runtime runs unquantized, "
                              "per-tensor FP8, NVFP4 and W4A16 AWQ unified checkpoints.")
    return fmt.quant_algo, fmt.kv_cache_quant_algo


def load_unified(ckpt_dir: Path, mapping: Mapping | None = None,
                 compute_dtype: torch.dtype = F32) -> CheckpointModel:
    """Load ``ckpt_dir`` (an HF directory, unquantized or ModelOpt FP8) for the CPU runtime at ``mapping``.

    Arguments:
        ckpt_dir: the unified checkpoint; mapping: the serving TP/PP (1×1 when omitted);
        compute_dtype: float32, or the checkpoint dtype to reproduce the GPU's rounding.
    """
    ckpt_dir, mapping = Path(ckpt_dir), mapping or Mapping(1, 1)
    model = inspect_model(str(ckpt_dir))
    hf = model.hf
    check_tp(hf.num_attention_heads, hf.num_key_value_heads, hf.intermediate_size, mapping.tp_size)
    algo, kv_algo = read_quantization(ckpt_dir)
    dtype = resolve_dtype("auto", hf)
    quantization = {**default_quantization(), "quant_algo": algo, "kv_cache_quant_algo": kv_algo,
                    "exclude_modules": ["lm_head"] if algo else None}  # the TensorRT-LLM checkpoint's spelling
    config = checkpoint_config(hf, model.family, mapping, dtype, quantization)
    ranks: list[dict[str, torch.Tensor]] = [{} for _ in range(mapping.world_size)]
    with ExitStack() as stack:
        handles = {path: stack.enter_context(safe_open(str(path), framework="pt")) for path in model.weight_files}

        def read(name: str) -> torch.Tensor:
            info = model.tensors.get(name)
            if info is None:
                raise CheckpointError(f"{ckpt_dir} lacks the tensor {name!r}; export the checkpoint again.")
            tensor = handles[info.path].get_tensor(name)
            if algo == "NVFP4" and tensor.dtype == torch.uint8 and LAYER_LINEAR.match(name):
                module = name.removesuffix(".weight")
                return nvfp4_dequantize(tensor, read(f"{module}.weight_scale"), read(f"{module}.weight_scale_2"))
            if algo == "W4A16_AWQ" and tensor.dtype == torch.uint8 and LAYER_LINEAR.match(name):
                module = name.removesuffix(".weight")
                weight = int4_dequantize(tensor, read(f"{module}.weight_scale"))
                if f"{module}.pre_quant_scale" in model.tensors:  # x · s · W = x · (W · s)
                    weight = weight * read(f"{module}.pre_quant_scale").float()
                return weight
            return tensor

        for item in work_items(model, mapping):
            fused: dict[str, torch.Tensor] = {}  # Phi-3's qkv_proj and gate_up_proj: read once for their parts

            def read_part(source: Source, fused: dict[str, torch.Tensor] = fused) -> torch.Tensor:
                if not isinstance(source, Slice):
                    return read(source)
                if source.name not in fused:
                    fused[source.name] = read(source.name)
                return fused[source.name][source.start:source.stop]

            parts = [read_part(source) for source in item.reads]
            module = item.rule.name.removeprefix("transformer.layers.{}.").removesuffix(".weight")
            is_fp8 = algo == "FP8" and item.rule.name.endswith(LINEAR_WEIGHTS)
            scales: dict[str, torch.Tensor] = {}
            if is_fp8:
                parts, scales = _fp8_group(parts, item.sources, module, read, model.tensors, getattr(torch, dtype))
            elif algo not in DEQUANTIZED or not item.rule.name.endswith(LINEAR_WEIGHTS):
                parts = [p.to(getattr(torch, dtype)) for p in parts]  # (dequantized weights stay float32)
            for tp_rank in range(mapping.tp_size):
                if item.rule.split is Split.QKV:
                    local = qkv_parts(parts, hf.num_key_value_heads, mapping.tp_size, tp_rank)
                else:
                    local = [shard(part, item.rule.split, mapping.tp_size, tp_rank) for part in parts]
                tensors = ranks[mapping.rank(tp_rank, item.pp_rank)]
                if is_fp8:
                    prefix = item.target.removesuffix(".weight")
                    tensors[item.target] = torch.cat([p.to(FP8_DTYPE) for p in local])
                    tensors[f"{prefix}.weights_scaling_factor"] = scales["w"].reshape(1)
                    tensors[f"{prefix}.activation_scaling_factor"] = scales["x"].reshape(1)
                else:
                    tensors[item.target] = torch.cat(local).contiguous()
                if kv_algo == "FP8" and item.rule.name.endswith("attention.qkv.weight"):
                    base = item.target.removesuffix("qkv.weight")
                    # unit scale (docs/llmapi.md §4.4)
                    tensors[f"{base}kv_cache_scaling_factor"] = torch.ones(1, dtype=F32)
    ranks = [prepare_weights(tensors, quantization, compute_dtype) for tensors in ranks]
    return CheckpointModel(config, ranks, compute_dtype, str(ckpt_dir))


def _fp8_group(parts: list[torch.Tensor], sources: tuple[str, ...], module: str,
               read: Callable[[str], torch.Tensor], names: Container[str],
               dtype: torch.dtype) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """The e4m3 parts rescaled to their fused group's largest weight scale as the backend does (``fp8_fused``),
    held in the model dtype (which holds e4m3 values exactly) for sharding, and the group's largest weight and
    input scales."""
    def scale(name: str, kind: str) -> torch.Tensor:
        return read(f"{name.removesuffix('.weight')}.{kind}").to(F32).reshape(())

    group = list(dict.fromkeys(sources))  # Phi-3's fused gate_up_proj is its own group
    fused = [f"{sources[0].rsplit('.', 2)[0]}.{part}.weight" for part in FUSED_PARTS.get(module, ())]
    if fused and all(name in names for name in fused):  # fc and gate are one gate_up linear on the GPU
        group = fused
    rescaled, w, x = fp8_fused(parts, [scale(name, "weight_scale") for name in sources],
                               [scale(name, "weight_scale") for name in group],
                               [scale(name, "input_scale") for name in group], dtype)
    return [part.to(dtype) for part in rescaled], {"w": w, "x": x}


def unified_loader(ckpt_dir: Path) -> Callable[[torch.dtype], CheckpointModel] | None:
    """``verify_checkpoint``'s loader for a unified checkpoint (an HF ``config.json``), at the serving TP/PP the
    artifact beside it records (1×1 without one); None for a TensorRT-LLM checkpoint.

    Arguments:
        ckpt_dir: the checkpoint directory.
    """
    config = json.loads((Path(ckpt_dir) / "config.json").read_text())
    if "architectures" not in config or "architecture" in config:
        return None
    mapping = Mapping(1, 1)
    if (Path(ckpt_dir).parent / "manifest.json").is_file():
        layout = Artifact.read(Path(ckpt_dir).parent).layout
        mapping = Mapping(layout.tp_size, layout.pp_size)
    return lambda dtype: load_unified(ckpt_dir, mapping, dtype)


def load_checkpoint(ckpt_dir: Path, mapping: Mapping) -> CheckpointModel:
    """The model the CPU ``LLM`` runs: a unified checkpoint loaded at ``mapping``, or a TensorRT-LLM checkpoint (a
    cpu artifact's ``checkpoint/``, sharded already: its mapping must be ``mapping``).

    Arguments:
        ckpt_dir: the checkpoint directory; mapping: the serving TP/PP.
    """
    config = json.loads((Path(ckpt_dir) / "config.json").read_text())
    if "architectures" in config and "architecture" not in config:
        return load_unified(ckpt_dir, mapping)
    model = CheckpointModel.load(Path(ckpt_dir))
    if model.dims.mapping != mapping:
        raise CheckpointError(f"{ckpt_dir} is sharded for tp {model.dims.mapping.tp_size} × pp "
                              f"{model.dims.mapping.pp_size}, not the tp {mapping.tp_size} × pp {mapping.pp_size} "
                              "asked for; pass its own sizes or convert it again.")
    return model
