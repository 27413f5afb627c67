"""Usage accounting per key and model: Prometheus counters and an append-only JSONL log read back at start."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, generate_latest

OUTCOMES = ("admitted", "unauthorized", "forbidden", "rate_limited", "quota_exceeded")


@dataclass(frozen=True)
class UsageRecord:
    """One finished request's tokens, as a line of the usage log."""

    time: float
    key: str
    tenant: str | None
    model: str
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class UsageLog:
    """The append-only log: one JSON object per line, written per request (in the kernel's page cache at once, so
    it survives the process ending however it ends; fsynced at close, not per request, which would cost
    milliseconds each: a machine crash may lose the last seconds of records).

    Arguments:
        path: the JSONL file (created with its directory when missing).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def append(self, record: UsageRecord) -> None:
        """Append one record (a single ``write`` of a whole line, so concurrent writers never interleave)."""
        os.write(self._fd, (json.dumps(asdict(record)) + "\n").encode())

    def records(self) -> Iterator[UsageRecord]:
        """Every complete record in the log (a torn last line, from a crash mid-write, is skipped)."""
        with self.path.open() as handle:
            for line in handle:
                try:
                    yield UsageRecord(**json.loads(line))
                except (ValueError, TypeError):
                    continue

    def close(self) -> None:
        os.fsync(self._fd)
        os.close(self._fd)


class UsageMetrics:
    """The gateway's counters: totals by model and outcome in the frontend's registry (anyone may scrape them),
    and the same by key and tenant in a registry of their own that only an admin key reads.

    Arguments:
        registry: the frontend's Prometheus registry.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.per_key = CollectorRegistry()
        self.tokens = Counter("trtllm_kit_gateway_tokens", "Tokens used, by model and kind (prompt or completion).",
                              ("model", "kind"), registry=registry)
        self.requests = Counter("trtllm_kit_gateway_requests", f"Requests by outcome ({', '.join(OUTCOMES)}).",
                                ("outcome",), registry=registry)
        self.key_tokens = Counter("trtllm_kit_gateway_key_tokens", "Tokens used, by key, tenant, model and kind.",
                                  ("key", "tenant", "model", "kind"), registry=self.per_key)
        self.key_requests = Counter("trtllm_kit_gateway_key_requests", "Requests by key and outcome.",
                                    ("key", "outcome"), registry=self.per_key)

    def outcome(self, key: str, outcome: str) -> None:
        """Count a request's outcome.

        Arguments:
            key: the key's name ("" when no key matched); outcome: one of ``OUTCOMES``.
        """
        self.requests.labels(outcome).inc()
        self.key_requests.labels(key, outcome).inc()

    def used(self, record: UsageRecord) -> None:
        """Count a finished request's tokens.

        Arguments:
            record: the request's usage.
        """
        tenant = record.tenant or ""
        for kind, count in (("prompt", record.prompt_tokens), ("completion", record.completion_tokens)):
            self.tokens.labels(record.model, kind).inc(count)
            self.key_tokens.labels(record.key, tenant, record.model, kind).inc(count)

    def per_key_exposition(self) -> bytes:
        """The per-key series in Prometheus text format."""
        return generate_latest(self.per_key)
