"""How many torch threads a served CPU model computes with, one rule for every server that runs the runtime: the
Triton ``tensorrt_llm`` model (unless its ``cpu_threads`` parameter says), the Triton llmapi model on the CPU, a
Dynamo worker and a Ray Serve replica.

When the server's environment sets ``OMP_NUM_THREADS``, every step computes with torch's count (which follows it).
Else a step of several rows (a prompt, several sequences' new tokens) computes with torch's count, the machine's
physical cores, and a step of one row (one sequence's one new token) with ``RESERVED_CORES`` fewer, at least 1: its
products are bound by memory, not arithmetic, and gain little from the last core, which the serve's other processes
then use without holding the step up. The engine loop's thread is the only one that runs torch, so the model takes
one inter-op thread, and the model is loaded on a thread that ends (``on_passing_thread``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import torch

# Cores a one-row step leaves to the serve's other processes (tritonserver, the OpenAI frontend, the pre/post-
# processing and BLS stubs; Dynamo's frontend and router; Ray's raylet and proxy), which run between and beside the
# model's steps: a torch thread whose core they take holds up every parallel operation of the step. On a 2-core
# machine, SmolLM2 served at one thread answered 1.33x and 1.02x (two days) the tokens/s of two threads at batch 1,
# and 1.08x and 0.85x at 8 concurrent requests; 1.08x and 0.83x with the model loaded on a passing thread
# (python benchmarks/served_threads.py; docs/cpu-runtime-speed.md).
RESERVED_CORES = 1
T = TypeVar("T")


@dataclass(frozen=True)
class StepThreads:
    """Torch intra-op threads for each step: ``one_row`` for a step of one row, ``several_rows`` for any other."""

    one_row: int
    several_rows: int

    @classmethod
    def fixed(cls, count: int) -> StepThreads:
        """``count`` threads for every step.

        Arguments:
            count: threads, at least 1.
        """
        return cls(count, count)

    def of_rows(self, rows: int) -> int:
        """The threads of a step computing ``rows`` tokens.

        Arguments:
            rows: the step's scheduled tokens.
        """
        return self.one_row if rows <= 1 else self.several_rows


def default_threads(environ: Mapping[str, str] = os.environ) -> StepThreads:
    """The served model's threads when nothing else sets them (see the module).

    Arguments:
        environ: the server's environment.
    """
    count = torch.get_num_threads()
    if environ.get("OMP_NUM_THREADS", "").strip():
        return StepThreads.fixed(count)
    return StepThreads(max(1, count - RESERVED_CORES), count)


def compute_with(threads: StepThreads) -> None:
    """Set this process's torch threads for a served model before it loads: the several-row count, one inter-op
    thread (the engine sets each step's count, ``Executor.step_threads``).

    Arguments:
        threads: the model's threads.
    """
    torch.set_num_threads(threads.several_rows)
    if torch.get_num_interop_threads() != 1:
        with contextlib.suppress(RuntimeError):  # torch sets it once, before any inter-op work: else left as it is
            torch.set_num_interop_threads(1)


def on_passing_thread(make: Callable[[], T]) -> T:
    """``make()`` run on a thread of its own that ends when it returns: its value, or the exception it raised.

    A served model is loaded (and its engine made) here, not on the thread that then answers requests, because
    libgomp keeps a pool of OpenMP workers for every thread that has run a parallel operation, and once a process's
    pools hold more threads than the machine has cores, every idle worker sleeps instead of spinning: each parallel
    operation of a step then waits for its workers to wake. A load on a server's main thread left its pool beside
    the engine thread's (four threads on two cores); a thread that ends takes its pool with it, so the engine
    thread's is the process's only one. SmolLM2's executor at 8 concurrent requests on 2 cores, stepped on a thread
    of its own: 52.0-54.5 tokens/s loaded on the main thread, 95.8-96.0 loaded on a passing thread, 97.8-114.5 loaded
    and stepped on one thread (``python benchmarks/load_thread.py``).

    Arguments:
        make: what to run (the model's load and the engine's construction).
    """
    with ThreadPoolExecutor(1, thread_name_prefix="trtllm-kit-load") as one:  # its thread ends on the way out
        return one.submit(make).result()
