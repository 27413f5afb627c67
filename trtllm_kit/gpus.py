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


TERA = 10**12


@dataclass(frozen=True)
class Board:
    """One row of the GPU table: what ``nvidia-smi`` reports for the board and its datasheet's roofline figures.

    The FLOP/s are dense tensor-core peaks (NVIDIA's datasheets print the sparse ones with an asterisk: half of
    those); None where the board has no such tensor cores or the figure was not confirmed.
    """

    memory_mib: int  # the ``memory.total`` nvidia-smi reports (MiB), not the marketing figure
    compute_capability: tuple[int, int]
    memory_bandwidth: float | None = None  # bytes/s
    fp16_flops: float | None = None  # FP16 and BF16 (the same figure on every board that has BF16)
    fp8_flops: float | None = None
    int8_ops: float | None = None


# The roofline figures are NVIDIA's datasheet tables (read through reprints of those tables), per board family below;
# a figure the sources did not agree on or did not give is None, and the plan then says it does not know.
GPU_TABLE: dict[str, Board] = {
    # NVIDIA HGX B200 specifications (per GPU, 1,000 W): FP16/BF16 4.5, FP8 9, INT8 9 PFLOPS* sparse; 8 TB/s
    "B200": Board(183359, (10, 0), 8.0 * TERA, 2250 * TERA, 4500 * TERA, 4500 * TERA),
    # NVIDIA H200 datasheet (H200 SXM): FP16/BF16 1,979, FP8 3,958, INT8 3,958 TFLOPS* sparse; 4.8 TB/s
    "H200": Board(143771, (9, 0), 4.8 * TERA, 989.5 * TERA, 1979 * TERA, 1979 * TERA),
    # GH200: not confirmed (96 GB HBM3 and 144 GB HBM3e boards differ in bandwidth)
    "GH200": Board(97871, (9, 0)),
    # NVIDIA H100 datasheet (H100 SXM): FP16/BF16 1,979, FP8 3,958, INT8 3,958 TFLOPS* sparse; 3.35 TB/s
    "H100-80GB": Board(81559, (9, 0), 3.35 * TERA, 989.5 * TERA, 1979 * TERA, 1979 * TERA),
    # H100 NVL: not confirmed (the datasheet's NVL column changed from a pair of boards to one)
    "H100-NVL": Board(95830, (9, 0)),
    # NVIDIA A100 datasheet: FP16/BF16 312, INT8 624 TOPS dense; 80 GB SXM 2,039 GB/s (PCIe 1,935), 40 GB 1,555 GB/s
    "A100-80GB": Board(81920, (8, 0), 2039e9, 312 * TERA, None, 624 * TERA),
    "A100-40GB": Board(40960, (8, 0), 1555e9, 312 * TERA, None, 624 * TERA),
    # NVIDIA L40S / L40 datasheets: FP16/BF16 362.05 / 181.05, FP8 733 / 362, INT8 733 / 362 dense; 864 GB/s
    "L40S": Board(46068, (8, 9), 864e9, 362.05 * TERA, 733 * TERA, 733 * TERA),
    "L40": Board(46068, (8, 9), 864e9, 181.05 * TERA, 362 * TERA, 362 * TERA),
    # NVIDIA L4 datasheet: FP16/BF16 242, FP8 485, INT8 485 TFLOPS* sparse; 300 GB/s
    "L4": Board(23034, (8, 9), 300e9, 121 * TERA, 242.5 * TERA, 242.5 * TERA),
    # A10G: AWS's board, no NVIDIA datasheet; A10, RTX 4090, RTX 6000 Ada: not confirmed
    "A10G": Board(23028, (8, 6)),
    "A10": Board(23028, (8, 6)),
    "RTX-4090": Board(24564, (8, 9)),
    "RTX-6000-ADA": Board(49140, (8, 9)),
    # NVIDIA T4 datasheet (Turing: no sparsity): FP16 mixed precision 65 TFLOPS, INT8 130 TOPS; 320 GB/s
    "T4": Board(15360, (7, 5), 320e9, 65 * TERA, None, 130 * TERA),
    # V100: FP16 125 TFLOPS on SXM2, 112 on PCIe, and the row does not say which board; 900 GB/s on both
    "V100-32GB": Board(32768, (7, 0), 900e9),
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
    board = GPU_TABLE[matches[0]]
    return GPU(matches[0], board.memory_mib * MIB, board.compute_capability, "table")


def board_of(gpu: GPU) -> Board | None:
    """The table's row of a GPU planned from it (``--gpu NAME``); None for NVML's or ``--gpu-memory``'s GPU.

    Arguments:
        gpu: the GPU the plan is for.
    """
    return GPU_TABLE.get(gpu.name) if gpu.source.startswith("table") else None


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
