"""Load modes on one event loop: offline burst, closed-loop concurrency, open-loop Poisson rate, soak.

Closed loop keeps exactly C requests in flight with C worker coroutines. Open loop sends at pre-generated
arrival times: a Poisson process conditioned on its count (n uniform times on ``[0, n/λ]``, sorted, seeded),
so the offered rate is exactly λ and any shortfall is the pacer's; the pacer sleeps until 2 ms before each
send and then yields in a tight loop. An event-loop lag probe measures the client's own saturation.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from trtllm_kit.errors import KitUsageError
from trtllm_kit.profile.clients import StreamClient
from trtllm_kit.profile.records import RequestRecord
from trtllm_kit.profile.workload import Prompt

MODES = ("concurrency", "rate", "offline")
SPIN_NS = 2_000_000


@dataclass
class PhaseResult:
    """The records of one measured phase and its window."""

    records: list[RequestRecord]
    window_ns: tuple[int, int]
    offered_span_ns: int | None = None
    loop_lag_ms: list[float] = field(default_factory=list)


def poisson_schedule(rate: float, count: int, seed: int) -> list[int]:
    """Send offsets in ns: ``count`` sorted uniform times on ``[0, count/rate]`` (Poisson given its count).

    Arguments:
        rate: target requests per second.
        count: number of requests.
        seed: seed of the generator.
    """
    if rate <= 0 or count < 1:
        raise KitUsageError(f"a Poisson schedule needs rate > 0 and at least one request, got {rate} and {count}.")
    span = count / rate
    times = np.sort(np.random.default_rng(seed).uniform(0.0, span, count))
    return [int(t * 1e9) for t in times]


class LagProbe:
    """Measures how late a 10 ms timer fires: a saturated client shows lag in its own event loop."""

    def __init__(self, period_s: float = 0.01) -> None:
        self.period_s = period_s
        self.lags_ms: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            start = time.monotonic_ns()
            await asyncio.sleep(self.period_s)
            self.lags_ms.append((time.monotonic_ns() - start) / 1e6 - self.period_s * 1e3)

    def __enter__(self) -> LagProbe:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._task is not None:
            self._task.cancel()


async def _sleep_until(t_ns: int) -> None:
    remaining = t_ns - time.monotonic_ns()
    if remaining > SPIN_NS:
        await asyncio.sleep((remaining - SPIN_NS) / 1e9)
    while time.monotonic_ns() < t_ns:
        await asyncio.sleep(0)


def _new_record(prompt: Prompt, label: str) -> RequestRecord:
    return RequestRecord(prompt.request_id, prompt.isl, prompt.osl, level=label)


async def closed_loop(client: StreamClient, prompts: Iterable[Prompt], concurrency: int,
                      duration_s: float | None = None, on_done: Callable[[RequestRecord], None] | None = None,
                      label: str = "") -> PhaseResult:
    """Exactly ``concurrency`` requests in flight until the prompts (or ``duration_s``) run out.

    Arguments:
        client: the streaming client.
        prompts: requests in order, or an endless iterator for a duration-bounded run (soak).
        concurrency: requests in flight.
        duration_s: optional bound on the time new requests are issued.
        on_done: called with each finished record (progress display).
        label: level label stored in each record.
    """
    if concurrency < 1:
        raise KitUsageError(f"concurrency must be at least 1, got {concurrency}.")
    records: list[RequestRecord] = []
    queue = iter(prompts)
    t0 = time.monotonic_ns()
    deadline = t0 + int(duration_s * 1e9) if duration_s else None

    async def worker() -> None:
        for prompt in queue:
            if deadline is not None and time.monotonic_ns() >= deadline:
                return
            record = _new_record(prompt, label)
            records.append(record)
            await client.run(prompt, record)
            if on_done:
                on_done(record)

    with LagProbe() as probe:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return PhaseResult(records, _span(records), None, probe.lags_ms)


async def open_loop(client: StreamClient, prompts: Sequence[Prompt], rate: float, seed: int = 0,
                    on_done: Callable[[RequestRecord], None] | None = None, label: str = "") -> PhaseResult:
    """Send ``prompts`` at Poisson arrival times of rate ``rate``; the window starts at the schedule's origin.

    Arguments:
        client: the streaming client.
        prompts: one per arrival.
        rate: target requests per second.
        seed: seed of the arrival process.
        on_done: called with each finished record.
        label: level label stored in each record.
    """
    offsets = poisson_schedule(rate, len(prompts), seed)
    records: list[RequestRecord] = []
    tasks = []

    async def one(prompt: Prompt, record: RequestRecord) -> None:
        await client.run(prompt, record)
        if on_done:
            on_done(record)

    with LagProbe() as probe:
        origin = time.monotonic_ns() + 1_000_000
        for prompt, offset in zip(prompts, offsets, strict=True):
            await _sleep_until(origin + offset)
            record = _new_record(prompt, label)
            record.t_scheduled_ns = origin + offset
            records.append(record)
            tasks.append(asyncio.create_task(one(prompt, record)))
        await asyncio.gather(*tasks)
    window = (origin, max(r.t_end_ns for r in records))
    return PhaseResult(records, window, int(len(prompts) / rate * 1e9), probe.lags_ms)


async def offline(client: StreamClient, prompts: Sequence[Prompt],
                  on_done: Callable[[RequestRecord], None] | None = None, label: str = "") -> PhaseResult:
    """Submit every request at once (``trtllm-bench throughput`` parity).

    Arguments:
        client: the streaming client.
        prompts: the requests.
        on_done: called with each finished record.
        label: level label stored in each record.
    """
    return await closed_loop(client, prompts, max(1, len(prompts)), None, on_done, label)


async def warm_up(client: StreamClient, prompts: Sequence[Prompt], concurrency: int) -> None:
    """Untimed requests of the same scenario; their records are discarded.

    Arguments:
        client: the streaming client.
        prompts: warm-up requests (never reused for measurement).
        concurrency: requests in flight.
    """
    if prompts:
        await closed_loop(client, prompts, max(1, min(concurrency, len(prompts))))


def _span(records: Sequence[RequestRecord]) -> tuple[int, int]:
    if not records:
        now = time.monotonic_ns()
        return now, now
    return min(r.t_send_ns for r in records), max(r.t_end_ns for r in records)
