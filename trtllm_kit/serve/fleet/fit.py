"""Whether several artifacts fit on this machine together, from what their builds recorded, before anything starts.

GPU artifacts (``engine``, ``llmapi`` with a plan): each rank's planned bytes (weights, activations, buffers, KV
pool) land on a GPU (``gpu_device_ids`` of the ``tensorrt_llm`` model, else GPUs ``0..world_size-1``); per GPU
the bytes must fit its planned memory and the KV fractions must add up to at most 1. CPU artifacts: the CPU
runtime computes in float32, so each needs 4 bytes per weight element plus its KV pool
(``max_tokens_in_paged_kv_cache`` tokens of ``2 × layers × kv_heads × head_size × 4`` bytes); together they must
fit in this machine's available memory.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path

from trtllm_kit.errors import KitUsageError
from trtllm_kit.serve.servable import Servable

CPU_BYTES = 4  # the CPU runtime's compute dtype, float32
GIB = 1024**3


@dataclass(frozen=True)
class Need:
    """The memory one served artifact takes: bytes per GPU id, or host bytes (GPU id -1)."""

    name: str
    bytes_per_device: dict[int, int]
    kv_fraction: float = 0.0
    device_bytes: dict[int, int] = field(default_factory=dict)  # the memory each GPU was planned with

    @property
    def on_gpu(self) -> bool:
        return -1 not in self.bytes_per_device


def memory_need(name: str, target: Servable) -> Need:
    """What serving ``target`` under ``name`` takes, from its build's plan (GPU) or its checkpoint (CPU).

    Arguments:
        name: the served name (for messages); target: the artifact.
    """
    params = _trtllm_parameters(target.repo)
    plan = target.artifact.records.engine.plan if target.artifact.records.engine else None
    if target.target.uses_gpus and plan and plan.ranks:
        groups = [g for g in params.get("gpu_device_ids", "").split(";") if g.strip()]
        devices = [int(d) for d in groups[0].split(",")] if groups else list(range(len(plan.ranks)))
        per_device: dict[int, int] = {}
        for rank, device in zip(plan.ranks, devices, strict=False):
            per_device[device] = per_device.get(device, 0) + (rank.weight_bytes + rank.activation_bytes
                                                              + rank.buffer_bytes + rank.kv_pool_bytes)
        return Need(name, per_device, plan.kv_cache_fraction, dict.fromkeys(per_device, plan.gpu.memory_bytes))
    checkpoint = Path(params.get("gpt_model_path") or target.out / "checkpoint")
    weights = sum(_num_elements(path) for path in sorted(checkpoint.glob("*.safetensors"))) * CPU_BYTES
    kv = 0
    try:
        config = json.loads((checkpoint / "config.json").read_text())
        per_token = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * \
            config.get("head_size", config["hidden_size"] // config["num_attention_heads"]) * CPU_BYTES
        kv = int(params.get("max_tokens_in_paged_kv_cache") or 0) * per_token
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return Need(name, {-1: weights + kv})


def check_fit(needs: list[Need], available_bytes: int | None = None, what: str = "the models") -> None:
    """Refuse, in one sentence saying how much is missing, when ``needs`` do not fit together.

    Arguments:
        needs: the artifacts to serve together (those already served included, for a reload on a GPU).
        available_bytes: host memory available (this machine's, read now, when omitted).
        what: how the message names them.
    """
    host = [n for n in needs if not n.on_gpu]
    if host:
        if available_bytes is None:
            import psutil

            available_bytes = psutil.virtual_memory().available
        total = sum(n.bytes_per_device[-1] for n in host)
        if total > available_bytes:
            parts = ", ".join(f"{n.name} {_size(n.bytes_per_device[-1])}" for n in host)
            raise KitUsageError(f"{what} do not fit in this machine's memory: they need {_size(total)} ({parts}) "
                                f"and {_size(available_bytes)} is available, {_size(total - available_bytes)} "
                                "missing; serve fewer models or rebuild with a smaller KV cache.")
    for device in sorted({d for n in needs if n.on_gpu for d in n.bytes_per_device}):
        on = [n for n in needs if n.on_gpu and device in n.bytes_per_device]
        total = sum(n.bytes_per_device[device] for n in on)
        memory = min(n.device_bytes.get(device, 0) for n in on)
        parts = ", ".join(f"{n.name} {_size(n.bytes_per_device[device])}" for n in on)
        if total > memory:
            raise KitUsageError(f"{what} do not fit on GPU {device}: they need {_size(total)} ({parts}) of its "
                                f"{_size(memory)}, {_size(total - memory)} missing; rebuild them with smaller "
                                "--kv-cache-fraction values or give them other GPUs (gpu_device_ids).")
        fractions = sum(n.kv_fraction for n in on)
        if len(on) > 1 and fractions > 1.0 + 1e-9:
            shares = ", ".join(f"{n.name} {n.kv_fraction:g}" for n in on)
            raise KitUsageError(f"{what} share GPU {device} with KV-cache fractions adding up to {fractions:g} "
                                f"({shares}), {fractions - 1:g} more than the whole; rebuild them with "
                                "--kv-cache-fraction values that sum to at most 1.")


def _num_elements(path: Path) -> int:
    """Elements of every tensor in a safetensors file, from its header (the weights are not read)."""
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    return sum(math.prod(t["shape"]) for key, t in header.items() if key != "__metadata__")


def _trtllm_parameters(repo: Path) -> dict[str, str]:
    """The string parameters of ``repo/tensorrt_llm/config.pbtxt`` (empty when it has none)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    try:
        config = text_format.Parse((repo / "tensorrt_llm" / "config.pbtxt").read_text(), mc.ModelConfig())
    except (OSError, text_format.ParseError):
        return {}
    return {key: value.string_value for key, value in config.parameters.items()}


def _size(num_bytes: int) -> str:
    return f"{num_bytes / GIB:.2f} GiB" if num_bytes >= GIB else f"{num_bytes / 1024**2:.1f} MiB"
