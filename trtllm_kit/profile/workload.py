"""Workloads: synthetic token-id prompts with fixed or seeded lengths, and ``.jsonl`` prompt files.

Every request gets its own prompt (``seed = base_seed + request_number``) so that KV-cache reuse cannot
serve it from cache. Output length is forced: at least and at most ``osl`` tokens (``GenerationRequest.with_length``)
and an ``end_id`` that no sampled token can equal (``-1``); the load generator then checks the count it received.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trtllm_kit.errors import KitUsageError


@dataclass(frozen=True)
class Prompt:
    """One request's input ids and the number of tokens it must produce."""

    request_id: str
    input_ids: tuple[int, ...]
    osl: int

    @property
    def isl(self) -> int:
        return len(self.input_ids)


@dataclass(frozen=True)
class WorkloadSpec:
    """A seeded synthetic workload: fixed ISL/OSL when the stddevs are 0, else normal lengths (clipped ≥ 1)."""

    isl: int = 128
    osl: int = 128
    isl_std: float = 0.0
    osl_std: float = 0.0
    vocab_size: int = 1000
    special_ids: tuple[int, ...] = field(default=(0, 1, 2))
    seed: int = 0

    def __post_init__(self) -> None:
        if self.isl < 1 or self.osl < 1:
            raise KitUsageError(f"input and output lengths must be at least 1, got isl={self.isl} osl={self.osl}.")
        if self.vocab_size <= len(set(self.special_ids)):
            raise KitUsageError(f"vocab_size {self.vocab_size} leaves no ordinary token ids to sample prompts from.")


def sample_lengths(mean: int, std: float, count: int, seed: int) -> list[int]:
    """Seeded lengths: ``mean`` repeated when ``std`` is 0, else normal samples rounded and clipped to ≥ 1.

    Arguments:
        mean: mean length in tokens.
        std: standard deviation in tokens.
        count: how many lengths.
        seed: seed of the generator.
    """
    if std <= 0:
        return [mean] * count
    rng = np.random.default_rng(seed)
    return [max(1, round(float(x))) for x in rng.normal(mean, std, count)]


def synthetic_prompts(spec: WorkloadSpec, count: int, first: int = 0, prefix: str = "r") -> list[Prompt]:
    """``count`` prompts of uniform random ordinary token ids, request ``first + i`` seeded with ``seed + first + i``.

    Arguments:
        spec: the workload.
        count: number of prompts.
        first: number of the first request (warm-up and repeats use disjoint ranges).
        prefix: request id prefix.
    """
    allowed = np.setdiff1d(np.arange(spec.vocab_size, dtype=np.int64), np.array(spec.special_ids, dtype=np.int64))
    isls = sample_lengths(spec.isl, spec.isl_std, count, spec.seed + 7919 * (first + 1))
    osls = sample_lengths(spec.osl, spec.osl_std, count, spec.seed + 104729 * (first + 1))
    prompts = []
    for i in range(count):
        number = first + i
        rng = np.random.default_rng(spec.seed + number)
        ids = allowed[rng.integers(0, len(allowed), isls[i])]
        prompts.append(Prompt(f"{prefix}{number}", tuple(int(t) for t in ids), osls[i]))
    return prompts


def write_jsonl(prompts: Iterable[Prompt], path: Path) -> str:
    """Write ``{task_id, input_ids, output_tokens}`` lines (trtllm-bench's dataset format); returns the sha256.

    Arguments:
        prompts: the prompts.
        path: file to write.
    """
    lines = [json.dumps({"task_id": p.request_id, "input_ids": list(p.input_ids), "output_tokens": p.osl})
             for p in prompts]
    data = ("\n".join(lines) + "\n").encode()
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def read_jsonl(path: Path) -> list[Prompt]:
    """Read a prompt file written by ``write_jsonl`` (or by trtllm-bench's ``prepare_dataset.py``).

    Arguments:
        path: the ``.jsonl`` file.
    """
    if not path.is_file():
        raise KitUsageError(f"prompt file {path} does not exist; write one with trtllm_kit.profile.workload.")
    prompts = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            ids = tuple(int(t) for t in row["input_ids"])
            osl = int(row["output_tokens"])
        except (ValueError, KeyError, TypeError) as exc:
            raise KitUsageError(f"{path}:{number} is not a prompt line ({exc!r}); expected "
                                '{"task_id": ..., "input_ids": [...], "output_tokens": N}.') from None
        if not ids or osl < 1:
            raise KitUsageError(f"{path}:{number} has {len(ids)} input ids and output_tokens={osl}; both must be ≥ 1.")
        prompts.append(Prompt(str(row.get("task_id", f"f{number}")), ids, osl))
    if not prompts:
        raise KitUsageError(f"prompt file {path} holds no prompts.")
    return prompts
