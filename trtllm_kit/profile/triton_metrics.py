"""Triton's Prometheus ``/metrics``: scraped right before and after each phase and at 1 Hz in between,
parsed with ``prometheus_client``; counters are used as deltas over the window (``docs/harness.md`` §5)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

Key = tuple[str, tuple[tuple[str, str], ...]]


@dataclass
class Snapshot:
    """One scrape: ``{(sample name, sorted labels): value}`` at a monotonic time."""

    t_mono_ns: int
    values: dict[Key, float] = field(default_factory=dict)

    def total(self, name: str, **labels: str) -> float:
        """Sum of ``name`` over every series whose labels include ``labels``."""
        return sum(v for (n, lab), v in self.values.items() if n == name and set(labels.items()) <= set(lab))

    def series(self, name: str, label: str) -> dict[str, float]:
        """``{label value: value}`` of ``name`` (e.g. request_type → count)."""
        return {dict(lab).get(label, ""): v for (n, lab), v in self.values.items() if n == name}


def parse_metrics(text: str, t_mono_ns: int | None = None) -> Snapshot:
    """Parse Prometheus exposition text.

    Arguments:
        text: the ``/metrics`` body.
        t_mono_ns: when it was scraped (default now).
    """
    snapshot = Snapshot(t_mono_ns if t_mono_ns is not None else time.monotonic_ns())
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = family.name if sample.name == f"{family.name}_total" else sample.name  # counters: Triton's name
            snapshot.values[(name, tuple(sorted(sample.labels.items())))] = float(sample.value)
    return snapshot


class MetricsScraper:
    """Scrapes ``url`` on demand and every ``period_s`` while ``running`` (an asyncio task)."""

    def __init__(self, url: str, period_s: float = 1.0) -> None:
        self.url, self.period_s = url, period_s
        self.snapshots: list[Snapshot] = []
        self.error = ""
        self._task: asyncio.Task | None = None

    async def scrape(self) -> Snapshot | None:
        """One scrape, appended to ``snapshots``; None (and ``error`` set) when the endpoint does not answer."""
        import aiohttp

        try:
            async with aiohttp.ClientSession() as session, session.get(self.url,
                                                                      timeout=aiohttp.ClientTimeout(total=5)) as r:
                status, text = r.status, await r.text()
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            self.error = f"cannot scrape {self.url}: {type(exc).__name__} {exc}"
            return None
        if status != 200:
            self.error = f"{self.url} answers HTTP {status}"
            return None
        try:
            snapshot = parse_metrics(text)
        except ValueError as exc:
            self.error = f"{self.url} does not answer with Prometheus metrics ({exc})"
            return None
        self.snapshots.append(snapshot)
        return snapshot

    async def probe(self) -> bool:
        """Whether ``url`` answers with Triton's metrics (an ``nv_inference_*`` family); ``error`` says why not.
        The probe's scrape is not kept."""
        snapshot = await self.scrape()
        if snapshot is None:
            return False
        self.snapshots.remove(snapshot)
        if not any(name.startswith("nv_inference_") for name, _ in snapshot.values):
            self.error = f"{self.url} answers, but without Triton's nv_inference_* metrics"
            return False
        return True

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.period_s)
            await self.scrape()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    def stop(self) -> None:
        if self._task:
            self._task.cancel()
            self._task = None

    def rows(self) -> list[dict[str, Any]]:
        """Long form for ``server_metrics.csv``: t_mono_ns, metric, labels, value."""
        return [{"t_mono_ns": s.t_mono_ns, "metric": name, "labels": ",".join(f"{k}={v}" for k, v in labels),
                 "value": value} for s in self.snapshots for (name, labels), value in s.values.items()]


KV_TRANSFER_FAMILY = "trtllm_kit_kv_transfer_metrics"  # gauges of a disaggregated serve's CPU engines


def kv_transfer(before: Snapshot, after: Snapshot, **labels: str) -> tuple[float | None, int]:
    """(mean KV transfer ms per request, transfers) between two scrapes of a generation server (None, 0 without
    transfers).

    Arguments:
        before, after: the scrapes; labels: a filter (e.g. ``model``).
    """
    def delta(kind: str) -> float:
        return after.total(KV_TRANSFER_FAMILY, kv_transfer_type=kind, **labels) - \
            before.total(KV_TRANSFER_FAMILY, kv_transfer_type=kind, **labels)

    transfers = int(delta("transfers"))
    return (delta("seconds") / transfers * 1e3 if transfers > 0 else None), max(transfers, 0)


def window_summary(before: Snapshot, after: Snapshot, during: list[Snapshot], model: str | None = None) -> dict:
    """Server-side values of one window: request deltas, mean queue/compute time, gauges' mean and max.

    Arguments:
        before: scrape right before T0.
        after: scrape right after T1.
        during: periodic scrapes inside the window.
        model: restrict ``nv_inference_*`` to this model (default all).
    """
    labels = {"model": model} if model else {}
    delta = lambda name, **lab: after.total(name, **labels, **lab) - before.total(name, **labels, **lab)  # noqa: E731
    success, failure = delta("nv_inference_request_success"), delta("nv_inference_request_failure")
    out: dict[str, Any] = {"model": model, "request_success": success, "request_failure": failure}
    if success:
        out["queue_ms_per_request"] = delta("nv_inference_queue_duration_us") / success / 1000
        out["compute_infer_ms_per_request"] = delta("nv_inference_compute_infer_duration_us") / success / 1000
    seconds = (after.t_mono_ns - before.t_mono_ns) / 1e9
    iterations = delta("nv_trt_llm_general_metrics", general_type="iteration_counter")
    if iterations and seconds > 0:
        out["engine_steps_per_s"] = iterations / seconds
        counter = {"general_type": "iteration_counter", **labels}
        out["iteration_counter"] = [before.total("nv_trt_llm_general_metrics", **counter),
                                    after.total("nv_trt_llm_general_metrics", **counter)]
    gauges = {"pending_requests": ("nv_inference_pending_request_count", None),
              "trt_llm_requests": ("nv_trt_llm_request_metrics", "request_type"),
              "kv_cache_blocks": ("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type"),
              "inflight_batcher": ("nv_trt_llm_inflight_batcher_metrics", "inflight_batcher_specific_metric")}
    points = [before, *during, after]
    for key, (name, label) in gauges.items():
        if label is None:
            values = [s.total(name, **labels) for s in points]
            out[key] = {"mean": sum(values) / len(values), "max": max(values)}
            continue
        series: dict[str, list[float]] = {}
        for s in points:
            for kind, value in s.series(name, label).items():
                series.setdefault(kind, []).append(value)
        if series:
            out[key] = {kind: {"mean": sum(v) / len(v), "max": max(v)} for kind, v in series.items()}
    transfer_ms, transfers = kv_transfer(before, after, **labels)
    if transfers:
        out["kv_transfer_ms_per_request"], out["kv_transfers"] = transfer_ms, transfers
    kv = [s.series("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type") for s in points]
    utilization = [k["used"] / k["max"] for k in kv if k.get("max")]
    if utilization:
        out["kv_utilization"] = {"mean": sum(utilization) / len(utilization), "max": max(utilization)}
    return out
