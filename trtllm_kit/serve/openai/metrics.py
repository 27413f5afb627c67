"""The OpenAI frontend's Prometheus metrics: requests, errors, time to first token and inter-token latency per model.

Each frontend has its own registry, so two frontends in one process (tests) never share counters. The names follow
the ``trtllm_kit_openai_`` prefix; the histograms' buckets span a CPU runtime's tens of milliseconds up to a queued
request's minute.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from typing import TypeVar

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

TTFT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
CONTENT_TYPE = CONTENT_TYPE_LATEST
T = TypeVar("T")


class FrontendMetrics:
    """The frontend's counters and histograms, and the text Prometheus scrapes."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("trtllm_kit_openai_requests", "Generation requests answered, by HTTP status.",
                                ("model", "endpoint", "status"), registry=self.registry)
        self.errors = Counter("trtllm_kit_openai_errors", "Generation requests answered with an error status.",
                              ("model", "endpoint", "status"), registry=self.registry)
        self.ttft = Histogram("trtllm_kit_openai_time_to_first_token_seconds", "Seconds from the request to its "
                              "first generated piece.", ("model",), buckets=TTFT_BUCKETS_S, registry=self.registry)
        self.itl = Histogram("trtllm_kit_openai_inter_token_latency_seconds", "Seconds between generated pieces "
                             "(one token each for token-id prompts).", ("model",), buckets=ITL_BUCKETS_S,
                             registry=self.registry)

    def answered(self, model: str, endpoint: str, status: int) -> None:
        """Count an answered generation request (an error too when ``status`` is 400 or above).

        Arguments:
            model: the served model name (the ``model`` label).
            endpoint: ``completions`` or ``chat_completions``.
            status: the HTTP status of the answer.
        """
        self.requests.labels(model, endpoint, str(status)).inc()
        if status >= 400:
            self.errors.labels(model, endpoint, str(status)).inc()

    def timer(self, model: str) -> RequestTimer:
        """A timer for one request, started now.

        Arguments:
            model: the served model name.
        """
        return RequestTimer(self, model)

    def exposition(self) -> bytes:
        """The metrics in Prometheus text format."""
        return generate_latest(self.registry)


class RequestTimer:
    """Times one generation: the first piece gives TTFT, every later one an inter-token latency."""

    def __init__(self, metrics: FrontendMetrics, model: str) -> None:
        self.metrics, self.model = metrics, model
        self.started = self.last = time.monotonic()
        self.num_pieces = 0

    def piece(self) -> None:
        """Record that a piece of the answer arrived now."""
        now = time.monotonic()
        if self.num_pieces == 0:
            self.metrics.ttft.labels(self.model).observe(now - self.started)
        else:
            self.metrics.itl.labels(self.model).observe(now - self.last)
        self.last = now
        self.num_pieces += 1

    async def timed(self, pieces: AsyncGenerator[T, None]) -> AsyncGenerator[T, None]:
        """``pieces``, each timed as it arrives; closing this closes ``pieces``.

        Arguments:
            pieces: the generation's pieces.
        """
        try:
            async for piece in pieces:
                self.piece()
                yield piece
        finally:
            await pieces.aclose()
