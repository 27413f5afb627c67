"""This machine's engine toolchain and GPUs, and whether an artifact's engines can run here.

An engine runs only with the TensorRT-LLM/TensorRT versions it was built with and only on GPUs of the
compute capability it was built for (``docs/trtllm-checkpoint.md`` §7.5). ``compatibility`` is the one check that
``artifact verify`` and ``serve`` share.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from trtllm_kit.artifact import Artifact
from trtllm_kit.gpus import GPU, visible_gpus

TRTLLM_MIN = (0, 17)
TRTLLM_BELOW = (1, 3)
TRTLLM_RANGE = ">=0.17,<1.3"


@dataclass(frozen=True)
class Machine:
    """What decides whether engines can be built or run here."""

    tensorrt_llm: str | None
    tensorrt: str | None
    cuda: str | None    # the CUDA version the driver supports
    driver: str | None
    gpus: tuple[GPU, ...]
    has_trtllm_build: bool = False

    def to_dict(self) -> dict[str, Any]:
        gpu = self.gpus[0] if self.gpus else None
        return {"tensorrt_llm": self.tensorrt_llm, "tensorrt": self.tensorrt, "cuda": self.cuda,
                "driver": self.driver, "gpu": gpu.name if gpu else None,
                "compute_capability": gpu.sm if gpu else None, "num_gpus": len(self.gpus)}


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _driver() -> tuple[str | None, str | None]:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # NVMLError_LibraryNotFound and friends: no driver here
        return None, None
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
        return f"{cuda // 1000}.{cuda % 1000 // 10}", driver
    finally:
        pynvml.nvmlShutdown()


def detect_machine() -> Machine:
    """Versions of tensorrt_llm and tensorrt (from package metadata, without importing them), driver and GPUs."""
    trtllm = _version("tensorrt-llm") if importlib.util.find_spec("tensorrt_llm") else None
    tensorrt = next((v for v in map(_version, ("tensorrt", "tensorrt-cu12", "tensorrt-cu13")) if v), None)
    cuda, driver = _driver()
    return Machine(trtllm, tensorrt, cuda, driver, tuple(visible_gpus()), shutil.which("trtllm-build") is not None)


def version_tuple(version: str) -> tuple[int, ...]:
    """``"1.2.0rc2"`` → ``(1, 2, 0)``: the numeric release part."""
    match = re.match(r"^\s*v?(\d+(?:\.\d+)*)", version)
    return tuple(int(x) for x in match.group(1).split(".")) if match else ()


def engine_problem(machine: Machine) -> str | None:
    """Why engines cannot be built here (one sentence), or None."""
    if machine.tensorrt_llm is None:
        return (f"tensorrt_llm is not installed; engines need tensorrt-llm{TRTLLM_RANGE} and an NVIDIA GPU (install "
                "the kit's gpu extra or use the TensorRT-LLM 1.2.1 container), or build with --target cpu.")
    if not TRTLLM_MIN <= version_tuple(machine.tensorrt_llm)[:2] < TRTLLM_BELOW:
        return (f"tensorrt_llm {machine.tensorrt_llm} is installed, but engines need {TRTLLM_RANGE} (1.3 removed the "
                "TensorRT engine backend); install tensorrt-llm==1.2.1 or build with --target cpu.")
    if not machine.gpus:
        return "no NVIDIA GPU is visible (NVML found none); build engines on a GPU machine or use --target cpu."
    if not machine.has_trtllm_build:
        return "trtllm-build is not on PATH although tensorrt_llm is installed; activate its environment."
    return None


def compatibility(artifact: Artifact, machine: Machine) -> list[str]:
    """What keeps an artifact's engines from running here; empty when they can (or when it has none).

    Arguments:
        artifact: the artifact.
        machine: ``detect_machine()``.
    """
    engine = artifact.records.engine.built if artifact.records.engine else None
    if engine is None:
        return []
    problems = []
    if machine.tensorrt_llm != engine.tensorrt_llm:
        problems.append(f"the engines were built with tensorrt_llm {engine.tensorrt_llm}, this machine has "
                        f"{machine.tensorrt_llm or 'none'}")
    if engine.tensorrt and machine.tensorrt != engine.tensorrt:
        problems.append(f"the engines were built with TensorRT {engine.tensorrt}, this machine has "
                        f"{machine.tensorrt or 'none'}")
    sm = engine.compute_capability
    matching = [g for g in machine.gpus if g.sm == sm]
    if not machine.gpus:
        problems.append(f"the engines need {engine.world_size} GPU(s) of compute capability {sm}, none is visible")
    elif len(matching) < engine.world_size:
        seen = ", ".join(sorted({f"{g.name} (SM {g.sm})" for g in machine.gpus}))
        problems.append(f"the engines need {engine.world_size} GPU(s) of compute capability {sm} "
                        f"({engine.gpu}), this machine has {len(matching)} ({seen})")
    return problems
