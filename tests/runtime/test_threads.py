"""runtime/threads: the torch threads every server of the CPU runtime computes with when nothing sets them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trtllm_kit.llmapi.unified import write_unified
from trtllm_kit.models.inspect import inspect_model
from trtllm_kit.runtime.threads import RESERVED_CORES, StepThreads, default_threads, on_passing_thread
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


def test_a_passing_thread_gives_what_it_made_or_raises_what_it_raised() -> None:
    def refused() -> int:
        raise ValueError("no weights")

    assert on_passing_thread(lambda: 42) == 42
    with pytest.raises(ValueError, match="no weights"):
        on_passing_thread(refused)


# Native threads of the process (libgomp's workers among them) less its Python threads, at two torch threads, and
# the count once ``count`` threads at most are left (a thread and its workers end shortly after its join returns;
# at most 10 s).
NATIVE = ("import os, threading, time, torch; torch.set_num_threads(2); "
          "native = lambda: len(os.listdir('/proc/self/task')) - threading.active_count(); "
          "settled = lambda count: next((n for _ in range(100) if (n := native()) <= count or time.sleep(0.1)), "
          "native()); ")


def _native_counts(code: str, *argv: str) -> list[int]:
    done = subprocess.run([sys.executable, "-c", NATIVE + code, *argv], capture_output=True, text=True, timeout=300,
                          check=True)
    return list(map(int, done.stdout.split()))


def test_a_load_on_a_passing_thread_leaves_no_openmp_workers_behind() -> None:
    """A parallel operation leaves its thread a pool of OpenMP workers for as long as that thread lives: run on a
    passing thread, the pool ends with it (else a served model's main thread and engine thread hold two pools, more
    threads than a 2-core machine's cores, and libgomp's idle workers then sleep between a step's operations)."""
    code = ("from trtllm_kit.runtime.threads import on_passing_thread; "
            "op = lambda: torch.ones(4_000_000).add_(1).sum(); "
            "before = native(); on_passing_thread(op); apart = settled(before); op(); print(before, apart, native())")
    before, apart, on_main = _native_counts(code)
    assert apart == before  # the passing thread and its worker are gone
    assert on_main == before + 1  # the same operation on this thread leaves its worker: the count sees pools


def test_the_cpu_llm_loads_its_model_where_no_pool_stays(tmp_path: Path) -> None:
    """The Triton llmapi model, the Dynamo worker and the Ray replica make their engine in the CPU ``LLM``: its
    construction adds Python threads (the engine loop's) and no native one."""
    write_unified(inspect_model("builtin:tiny-llama"), tmp_path, "float32")
    code = ("import sys; before = native(); from trtllm_kit.llmapi.cpu_llm import LLM; llm = LLM(model=sys.argv[1]); "
            "print(before, settled(before)); llm.shutdown()")
    before, after = _native_counts(code, str(tmp_path))
    assert after == before
