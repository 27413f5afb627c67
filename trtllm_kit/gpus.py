"""GPUs the planner knows: a table of common boards, NVML when a GPU is present, or what the user says."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trtllm_kit.errors import KitUsageError

MIB = 2**20
GIB = 2**30


@dataclass(frozen=True)
class GPU:
    """One GPU as the planner sees it: total memory in bytes and the CUDA compute capability."""

    name: str
    memory_bytes: int
    compute_capability: tuple[int, int] | None  # None: unknown (only --gpu-memory was given)
    source: str  # "nvml", "table" or "--gpu-memory"

    @property
    def is_hopper_or_newer(self) -> bool:
        """FP8 context FMHA and the FP8 GEMM-SwiGLU plugin need SM 9.0 or newer."""
        return self.compute_capability is not None and self.compute_capability >= (9, 0)

    @property
    def has_fp8(self) -> bool:
        """FP8 weights, activations and KV cache need Ada (SM 8.9) or newer."""
        return self.compute_capability is not None and self.compute_capability >= (8, 9)

    @property
    def sm(self) -> str | None:
        cc = self.compute_capability
        return f"{cc[0]}.{cc[1]}" if cc else None

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "memory_bytes": self.memory_bytes, "compute_capability": self.sm,
                "source": self.source}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> GPU:
        """The GPU ``to_dict`` wrote.

        Arguments:
            values: ``name``, ``memory_bytes``, ``compute_capability`` (``"9.0"`` or None) and ``source``.
        """
        sm = values.get("compute_capability")
        major, _, minor = str(sm).partition(".") if sm else ("", "", "")
        return cls(str(values["name"]), int(values["memory_bytes"]), (int(major), int(minor)) if sm else None,
                   str(values.get("source", "table")))


# memory = the ``memory.total`` nvidia-smi reports for the board (MiB), not the marketing figure
GPU_TABLE: dict[str, tuple[int, tuple[int, int]]] = {
    "B200": (183359, (10, 0)),
    "H200": (143771, (9, 0)),
    "GH200": (97871, (9, 0)),
    "H100-80GB": (81559, (9, 0)),
    "H100-NVL": (95830, (9, 0)),
    "A100-80GB": (81920, (8, 0)),
    "A100-40GB": (40960, (8, 0)),
    "L40S": (46068, (8, 9)),
    "L40": (46068, (8, 9)),
    "L4": (23034, (8, 9)),
    "A10G": (23028, (8, 6)),
    "A10": (23028, (8, 6)),
    "RTX-4090": (24564, (8, 9)),
    "RTX-6000-ADA": (49140, (8, 9)),
    "T4": (15360, (7, 5)),
    "V100-32GB": (32768, (7, 0)),
}


def gpu_from_table(name: str) -> GPU:
    """A GPU of the table by name (case and separators do not matter: ``h100``, ``H100-80GB``, ``a100_40gb``).

    Arguments:
        name: the board name.
    """
    wanted = _norm(name)
    matches = [key for key in GPU_TABLE if _norm(key) == wanted]
    if not matches:  # "H100" alone means the common 80 GB board, "A100" the 80 GB one
        matches = [key for key in GPU_TABLE if _norm(key).startswith(wanted) and _norm(key)[len(wanted):] in
                   ("80gb",)]
    if not matches:
        raise KitUsageError(f"--gpu {name!r} is not a known GPU; known: {', '.join(GPU_TABLE)}; or pass "
                            "--gpu-memory GiB instead.")
    mib, cc = GPU_TABLE[matches[0]]
    return GPU(matches[0], mib * MIB, cc, "table")


def _norm(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def visible_gpus() -> list[GPU]:
    """The GPUs NVML sees (empty without a driver or GPU)."""
    import pynvml  # nvidia-ml-py: a dependency; it only talks to the driver when nvmlInit runs

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else name
            memory = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
            cc = tuple(pynvml.nvmlDeviceGetCudaComputeCapability(handle))
            gpus.append(GPU(name, memory, (int(cc[0]), int(cc[1])), "nvml"))
        return gpus
    finally:
        pynvml.nvmlShutdown()


def resolve_gpu(name: str | None, memory_gib: float | None, visible: list[GPU]) -> GPU | None:
    """The GPU to plan for: ``--gpu NAME`` or ``--gpu-memory GiB`` when given, else the first visible GPU.

    Both flags together take the table's compute capability and the given memory. None when nothing is known.

    Arguments:
        name: ``--gpu``.
        memory_gib: ``--gpu-memory``.
        visible: ``visible_gpus()``.
    """
    if memory_gib is not None and memory_gib <= 0:
        raise KitUsageError(f"--gpu-memory must be a positive number of GiB, got {memory_gib!r}.")
    if name:
        gpu = gpu_from_table(name)
        if memory_gib is not None:
            gpu = GPU(gpu.name, int(memory_gib * GIB), gpu.compute_capability, "table + --gpu-memory")
        return gpu
    if memory_gib is not None:
        return GPU(f"{memory_gib:g} GiB GPU", int(memory_gib * GIB), None, "--gpu-memory")
    return visible[0] if visible else None
