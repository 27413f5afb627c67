"""runtime/threads: the torch threads every server of the CPU runtime computes with when nothing sets them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from trtllm_kit.runtime.threads import RESERVED_CORES, StepThreads, default_threads
from trtllm_kit.triton_models.llmapi_classes import llm_classes


@pytest.mark.parametrize("cores, threads", [(1, 1), (2, 1), (16, 15)])
def test_the_default_leaves_a_core_at_one_row_unless_the_environment_sets_the_count(cores: int, threads: int) -> None:
    previous = torch.get_num_threads()
    torch.set_num_threads(cores)  # torch's count without OMP_NUM_THREADS: the machine's physical cores
    try:
        assert default_threads(environ={}) == StepThreads(threads, cores)
        assert default_threads(environ={"OMP_NUM_THREADS": " "}) == StepThreads(threads, cores)  # blank: not set
        assert default_threads(environ={"OMP_NUM_THREADS": str(cores)}) == StepThreads.fixed(cores)  # as set
    finally:
        torch.set_num_threads(previous)


def test_a_server_process_computes_with_the_default_and_one_interop_thread() -> None:
    """What the Dynamo worker, the Ray replica and the Triton models run first, in a process of its own whose
    environment sets no thread count."""
    code = ("import torch; cores = torch.get_num_threads(); "
            "from trtllm_kit.runtime.threads import compute_with, default_threads; d = default_threads(); "
            "compute_with(d); print(cores, d.one_row, d.several_rows, torch.get_num_threads(), "
            "torch.get_num_interop_threads())")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          check=True)
    cores, one_row, several_rows, threads, interop = map(int, done.stdout.split())
    assert (one_row, several_rows) == (max(1, cores - RESERVED_CORES), cores)  # the machine's cores
    assert (threads, interop) == (cores, 1)  # before the first step: the count of several rows


def test_the_llmapi_classes_say_they_are_the_cpu_runtime_without_a_gpu() -> None:
    classes = llm_classes()
    assert classes.on_cpu and classes.llm.__module__ == "trtllm_kit.llmapi.cpu_llm"
