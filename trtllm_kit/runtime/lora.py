"""LoRA adapters in the CPU runtime's form: per (layer, PEFT module) the pair A ``[r, in]`` and B ``[out, r]``,
with PEFT's scale (alpha / r) already multiplied into B, as TensorRT-LLM's converted adapters carry it; the
runtime adds ``(x @ A^T) @ B^T`` to the module's output and never scales. Which modules a family has, their sizes
and TensorRT-LLM's names for them are in ``lora_modules.py``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load

from trtllm_kit.errors import KitUsageError
from trtllm_kit.runtime.lora_modules import FUSED_GATE_UP, MODULE_IDS, module_shapes
from trtllm_kit.safe_files import read_bounded

ADAPTER_FILE = "adapter.safetensors"  # the converted adapter, in OUT/lora/NAME/

Pair = tuple[torch.Tensor, torch.Tensor]  # (A [r, in], B [out, r] scaled)


def cache_capacity(config: dict[str, Any], max_adapter_size: int, host_memory_bytes: int) -> int:
    """How many adapters of rank ``max_adapter_size`` on every module of every layer fit in ``host_memory_bytes``
    (the backend's LoRA cache pages are sized that way); refuses a cache that holds not even one, as the backend does.

    Arguments:
        config: a TensorRT-LLM checkpoint ``config.json``; max_adapter_size: the highest rank;
        host_memory_bytes: the cache's memory.
    """
    itemsize = torch.empty((), dtype=getattr(torch, str(config.get("dtype", "float32")))).element_size()
    per_layer = sum(fan_in + fan_out for fan_in, fan_out in module_shapes(config).values())
    adapter_bytes = max_adapter_size * per_layer * int(config["num_hidden_layers"]) * itemsize
    if host_memory_bytes < adapter_bytes:
        raise KitUsageError(f"Not enough space allocated to host LoRA cache to hold 1 max sized LoRA: "
                            f"lora_cache_host_memory_bytes is {host_memory_bytes}, one adapter of rank "
                            f"{max_adapter_size} takes {adapter_bytes}; raise it.")
    return host_memory_bytes // adapter_bytes


def tensor_names(layer: int, module: str) -> tuple[str, str]:
    """The converted file's names of A and B for a layer's module."""
    return f"layers.{layer}.{module}.lora_A", f"layers.{layer}.{module}.lora_B"


def load_adapter(path: Path, dtype: torch.dtype, max_bytes: int) -> dict[tuple[int, str], Pair]:
    """Read a converted adapter file (a regular file in its directory, at most ``max_bytes``) into its
    (layer, module) → (A, B) pairs in the compute dtype.

    Arguments:
        path: ``OUT/lora/NAME/adapter.safetensors``; dtype: the runtime's compute dtype;
        max_bytes: the file's bound (``lora.adapter_files.weights_bound``).
    """
    try:
        tensors = load(read_bounded(path, root=path.parent, max_bytes=max_bytes))
    except SafetensorError as exc:
        raise KitUsageError(f"{path} cannot be read as a converted LoRA adapter ({exc}); add the adapter again "
                            "(trtllm-kit lora add).") from None
    return adapter_pairs(tensors, dtype)


def adapter_pairs(tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[tuple[int, str], Pair]:
    """A converted adapter's tensors (named by ``tensor_names``) as (layer, module) → (A, B) pairs in ``dtype``.

    Arguments:
        tensors: the converted adapter, as ``ADAPTER_FILE`` holds it; dtype: the compute dtype.
    """
    pairs: dict[tuple[int, str], Pair] = {}
    for name in tensors:
        if name.endswith(".lora_A"):
            _, layer, module, _ = name.split(".")
            a_name, b_name = tensor_names(int(layer), module)
            pairs[(int(layer), module)] = finite_pair((tensors[a_name].to(dtype), tensors[b_name].to(dtype)),
                                                      f"the adapter's {module} of layer {layer}")
    return pairs


def finite_pair(pair: Pair, what: str) -> Pair:
    """``pair`` if every value of A and B is finite; NaN or infinity would make every logit of the request NaN.

    Arguments:
        pair: (A, B) in the compute dtype; what: the module and layer, for the refusal.
    """
    if not all(bool(torch.isfinite(t).all()) for t in pair):
        raise KitUsageError(f"{what} holds NaN or infinite values in {str(pair[0].dtype).removeprefix('torch.')}; "
                            "send an adapter whose weights are finite in the model's dtype.")
    return pair


def delta(x: torch.Tensor, pair: Pair) -> torch.Tensor:
    """The LoRA term ``(x @ A^T) @ B^T`` of one module (the scale is in B).

    Arguments:
        x: the module's input [..., in]; pair: (A, B).
    """
    a, b = pair
    return torch.nn.functional.linear(torch.nn.functional.linear(x, a), b)


class LoraNotCachedError(KitUsageError):
    """A request names an adapter the cache does not hold and brings no weights."""


@dataclass(frozen=True)
class AdapterWeights:
    """A request's adapter: its task id (the cache key) and, the first time or after an eviction, its weights."""

    task_id: int
    pairs: dict[tuple[int, str], Pair] | None = None


@dataclass(frozen=True)
class Adapter:
    """An adapter a sequence runs with (held by the sequence, so an eviction never changes a running one)."""

    task_id: int
    pairs: dict[tuple[int, str], Pair]


class AdapterCache:
    """The adapters the engine holds, at most ``capacity``, the least recently used evicted first (as the
    backend's LoRA cache: an uncached task id without weights is an error)."""

    def __init__(self, capacity: int) -> None:
        """Arguments:
        capacity: the most adapters held at once (at least 1).
        """
        if capacity < 1:
            raise KitUsageError(f"the LoRA cache must hold at least 1 adapter, got {capacity}.")
        self.capacity = capacity
        self.adapters: OrderedDict[int, Adapter] = OrderedDict()
        self.num_evictions = 0

    def resolve(self, request: AdapterWeights) -> Adapter:
        """The adapter of ``request``: its weights stored (evicting the oldest when full) or the cached one.

        Arguments:
            request: the request's task id and weights (None: expected in the cache).
        """
        if request.pairs is not None:
            self.adapters.pop(request.task_id, None)
            if len(self.adapters) >= self.capacity:
                self.adapters.popitem(last=False)
                self.num_evictions += 1
            self.adapters[request.task_id] = Adapter(request.task_id, request.pairs)
        elif request.task_id not in self.adapters:
            raise LoraNotCachedError(f"LoRA task {request.task_id} not found in cache. Please send LoRA weights "
                                     "with request.")
        self.adapters.move_to_end(request.task_id)
        return self.adapters[request.task_id]


@dataclass(frozen=True)
class Part:
    """A module's LoRA term on one tensor-parallel rank: the columns ``[start, stop)`` of the rank's linear output
    it adds to, the rows of B that are the rank's output features and the columns of A that are its input features
    (None: all of them)."""

    start: int
    stop: int
    b_rows: torch.Tensor | None = None
    a_cols: torch.Tensor | None = None

    def pair(self, pair: Pair) -> Pair:
        """The rank's slice of ``pair``."""
        a, b = pair
        return (a if self.a_cols is None else a[:, self.a_cols], b if self.b_rows is None else b[self.b_rows])


def rank_parts(config: dict[str, Any], tp_size: int, tp_rank: int) -> dict[str, dict[str, Part]]:
    """Per linear of a layer (TensorRT-LLM's names), where each PEFT module's term goes on ``tp_rank``, sliced as the
    weights are: column-parallel modules (q/k/v, gate/up, fused qkv_proj and gate_up_proj) take the rank's rows of
    B, with KV heads duplicated when fewer than ranks; row-parallel ones (o_proj, down_proj) take the rank's columns
    of A, and their partial terms are summed by the all-reduce with the base's.

    Arguments:
        config: a checkpoint ``config.json``; tp_size, tp_rank: the layout and the rank.
    """
    shapes = module_shapes(config)
    heads, kv_heads = int(config["num_attention_heads"]), int(config.get("num_key_value_heads") or
                                                               config["num_attention_heads"])
    head_size = shapes["o_proj"][0] // heads
    inter = int(config["intermediate_size"])

    def rows(size: int) -> torch.Tensor:
        return torch.arange(size).chunk(tp_size)[tp_rank]

    kv_order = torch.arange(kv_heads).repeat_interleave(max(1, tp_size // kv_heads))  # duplicated when kv < tp
    kv_rows = (kv_order.chunk(tp_size)[tp_rank][:, None] * head_size + torch.arange(head_size)).flatten()
    q_rows, q, kv = rows(heads * head_size), heads * head_size, kv_heads * head_size
    q_r, kv_r = len(q_rows), len(kv_rows)
    inter_rows = rows(inter)
    parts = {
        "attention.qkv": {"q_proj": Part(0, q_r, q_rows), "k_proj": Part(q_r, q_r + kv_r, kv_rows),
                          "v_proj": Part(q_r + kv_r, q_r + 2 * kv_r, kv_rows),
                          "qkv_proj": Part(0, q_r + 2 * kv_r, torch.cat([q_rows, q + kv_rows, q + kv + kv_rows]))},
        "attention.dense": {"o_proj": Part(0, shapes["o_proj"][1], a_cols=q_rows)},
        # the converted gate_up_proj B is [up; gate], as the swiglu fc: each rank holds its up rows, then its gate rows
        "mlp.fc": {"gate_proj": Part(0, len(inter_rows), inter_rows),
                   FUSED_GATE_UP: Part(0, 2 * len(inter_rows), torch.cat([inter_rows, inter + inter_rows]))},
        "mlp.gate": {"up_proj": Part(0, len(inter_rows), inter_rows)},
        "mlp.proj": {"down_proj": Part(0, shapes["down_proj"][1], a_cols=inter_rows)},
    }
    if tp_size == 1:  # the one rank's slices are the whole tensors: no copies
        return {name: {m: Part(p.start, p.stop) for m, p in modules.items()} for name, modules in parts.items()}
    return parts


class LoraBatch:
    """Which tokens of a flattened step run which adapter; ``add`` puts each adapter's term on its tokens."""

    def __init__(self, spans: list[tuple[Adapter, torch.Tensor]]) -> None:
        """Arguments:
        spans: per adapter in the step, the indices of its tokens in the step's flattened [N] token order.
        """
        self.spans = spans

    @classmethod
    def of_sequences(cls, adapters: list[Adapter | None], counts: list[int]) -> LoraBatch | None:
        """The batch of a step's sequences (None when none has an adapter).

        Arguments:
            adapters: each sequence's adapter or None; counts: its tokens in the step, in order.
        """
        rows: dict[int, tuple[Adapter, list[int]]] = {}
        offset = 0
        for adapter, count in zip(adapters, counts, strict=True):
            if adapter is not None:
                rows.setdefault(adapter.task_id, (adapter, []))[1].extend(range(offset, offset + count))
            offset += count
        if not rows:
            return None
        return cls([(adapter, torch.tensor(index)) for adapter, index in rows.values()])

    def add(self, layer: int, x: torch.Tensor, out: torch.Tensor, parts: dict[str, Part]) -> torch.Tensor:
        """``out`` with each adapted module's term (the rank's slice) added to its columns on its adapter's tokens.

        Arguments:
            layer: global layer number; x: the rank's linear input [..., in]; out: its output [..., out];
            parts: PEFT module name → where its term goes on this rank (``rank_parts``).
        """
        flat_x, flat_out = x.reshape(-1, x.shape[-1]), out.reshape(-1, out.shape[-1]).clone()
        for adapter, index in self.spans:
            for module, part in parts.items():
                pair = adapter.pairs.get((layer, module))
                if pair is not None:
                    flat_out[index, part.start:part.stop] += delta(flat_x[index], part.pair(pair))
        return flat_out.reshape(out.shape)


def to_rows(pairs: dict[tuple[int, str], Pair]) -> tuple[torch.Tensor, torch.Tensor]:
    """The backend's ``lora_weights`` [N, W] (A then B flattened per row, zero-padded) and ``lora_config`` [N, 3]
    (module id, layer, rank) of an adapter.

    Arguments:
        pairs: the converted adapter's (layer, module) → (A, B).
    """
    rows = [torch.cat([a.flatten(), b.flatten()]) for a, b in pairs.values()]
    width = max(len(r) for r in rows)
    weights = torch.stack([torch.nn.functional.pad(r, (0, width - len(r))) for r in rows])
    config = torch.tensor([[MODULE_IDS[m], layer, pair[0].shape[0]] for (layer, m), pair in pairs.items()],
                          dtype=torch.int32)
    return weights, config


def from_rows(weights: torch.Tensor, config: torch.Tensor, model_config: dict[str, Any],
              dtype: torch.dtype) -> dict[tuple[int, str], Pair]:
    """An adapter's pairs from the backend's ``lora_weights`` [N, W] and ``lora_config`` [N, 3], checked.

    Arguments:
        weights: one row per (module, layer); config: (module id, layer, rank) rows;
        model_config: the checkpoint's ``config.json``; dtype: the runtime's compute dtype.
    """
    shapes, names = module_shapes(model_config), {v: k for k, v in MODULE_IDS.items()}
    if weights.ndim != 2 or config.ndim != 2 or config.shape[1] != 3 or len(weights) != len(config):
        raise KitUsageError(f"lora_weights {list(weights.shape)} and lora_config {list(config.shape)} must be [N, W] "
                            "and [N, 3] with one row per module and layer.")
    pairs: dict[tuple[int, str], Pair] = {}
    for row, (module_id, layer, rank) in zip(weights, config.tolist(), strict=True):
        module = names.get(module_id)
        if module not in shapes:
            raise KitUsageError(f"lora module id {module_id} is not enabled for this model (it has "
                                f"{', '.join(f'{MODULE_IDS[m]} ({m})' for m in shapes)}).")
        if not 0 <= layer < int(model_config["num_hidden_layers"]) or rank < 1:
            raise KitUsageError(f"lora_config row ({module_id}, {layer}, {rank}) needs a layer in [0, "
                                f"{model_config['num_hidden_layers']}) and a rank above 0.")
        fan_in, fan_out = shapes[module]
        if len(row) < rank * (fan_in + fan_out):
            raise KitUsageError(f"lora_weights has too few values for {module} of layer {layer}: {len(row)}, needs "
                                f"{rank * (fan_in + fan_out)} at rank {rank}.")
        a = row[: rank * fan_in].reshape(rank, fan_in)
        b = row[rank * fan_in: rank * (fan_in + fan_out)].reshape(fan_out, rank)
        pairs[(layer, module)] = finite_pair((a.to(dtype), b.to(dtype)), f"lora_weights for {module} of layer {layer}")
    return pairs
