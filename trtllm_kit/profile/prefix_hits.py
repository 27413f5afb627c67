"""Which worker served each request, and the prefix hit rate that routing allows.

A ``serve --dynamo`` worker logs ``request completed request_id=ID`` for each request it served, and the frontend
answers with ``cmpl-ID``: the two name the worker of every request. The hit rate here is modelled from the
routing, apart from what the workers counted (``serve/dynamo/metrics.py``): each worker keeps every full block of
every prompt it was sent (a cache that never evicts; a bounded one does, which only the counted rate shows), and a
request hits its leading blocks that its worker already holds (never the block of its last token, as
``runtime/block_manager.py``). The ideal is the same requests all on one worker: every prefix in one cache.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trtllm_kit.errors import KitUsageError

COMPLETED = re.compile(r"request completed request_id=([0-9a-f-]+)")
WORKER_LOG = "worker-*.log"


@dataclass
class WorkerShare:
    """One worker's requests, the prompt tokens it was sent and how many of them its cache held."""

    num_requests: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def modelled_hits(served: Sequence[tuple[str, Sequence[int]]], block_size: int) -> dict[str, WorkerShare]:
    """Each worker's share and hit tokens for requests sent in the given order.

    Arguments:
        served: ``(worker, prompt ids)`` per request, in the order they were sent.
        block_size: tokens per KV block of the workers.
    """
    if block_size < 1:
        raise KitUsageError(f"block size must be at least 1 token, got {block_size}; pass the artifact's "
                            "tokens_per_block.")
    held: dict[str, set[tuple[int, ...]]] = {}
    shares: dict[str, WorkerShare] = {}
    for worker, ids in served:
        blocks = held.setdefault(worker, set())
        share = shares.setdefault(worker, WorkerShare())
        share.num_requests += 1
        share.prompt_tokens += len(ids)
        reusable = (len(ids) - 1) // block_size
        hits = 0
        while hits < reusable and tuple(ids[:(hits + 1) * block_size]) in blocks:
            hits += 1
        share.hit_tokens += hits * block_size
        blocks.update(tuple(ids[:(b + 1) * block_size]) for b in range(len(ids) // block_size))
    return shares


def total(shares: dict[str, WorkerShare]) -> WorkerShare:
    """The shares of every worker added up.

    Arguments:
        shares: per worker.
    """
    out = WorkerShare()
    for share in shares.values():
        out.num_requests += share.num_requests
        out.prompt_tokens += share.prompt_tokens
        out.hit_tokens += share.hit_tokens
    return out


def served_by(log_dir: Path) -> dict[str, str]:
    """``request id → worker`` from the worker logs in ``log_dir`` (``RUN_DIR/dynamo`` of a ``serve --dynamo``).

    Arguments:
        log_dir: the directory holding ``worker-N.log``.
    """
    logs = sorted(log_dir.glob(WORKER_LOG))
    if not logs:
        raise KitUsageError(f"--dynamo-logs {log_dir} holds no {WORKER_LOG}; pass the serve's RUN_DIR/dynamo "
                            "(its state's run_dir, plus /dynamo).")
    workers = {}
    for log in logs:
        for match in COMPLETED.finditer(log.read_text(errors="replace")):
            workers[match.group(1)] = log.stem
    return workers


def response_request_id(response_id: str) -> str:
    """The request id inside a completion's ``id`` (``cmpl-ID``).

    Arguments:
        response_id: the ``id`` field of a completion chunk.
    """
    return response_id.split("-", 1)[1] if "-" in response_id else response_id
