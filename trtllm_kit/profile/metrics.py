"""Metric definitions (``docs/harness.md`` §4) computed from per-request records.

Per request: TTFT ``t_1 − t_send``, TTST ``t_2 − t_1``, inter-chunk latency ``t_k − t_{k−1}``, per-chunk ITL
``ICL_k / n_k`` counted ``n_k`` times, TPOT ``(t_m − t_1)/(OSL_obs − 1)``, E2E ``t_end − t_send``; chunks
with no tokens are ignored. Aggregates are over the window ``D``; percentiles interpolate linearly and always
carry their sample count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trtllm_kit.errors import KitUsageError
from trtllm_kit.profile.records import SPECULATIVE_COUNTS, RequestRecord

NS_PER_MS = 1e6
SLO_KEYS = ("ttft", "itl", "tpot", "e2e")


def stats(values: Sequence[float], weights: Sequence[int] | None = None) -> dict[str, float | int]:
    """count, mean, std, min, p50, p90, p95, p99, max (linear interpolation); ``weights`` repeat values.

    Arguments:
        values: the samples.
        weights: optional integer multiplicity of each sample (per-chunk ITL counts a chunk n_k times).
    """
    x = np.asarray(values, dtype=np.float64)
    if weights is not None:
        x = np.repeat(x, np.asarray(weights, dtype=np.int64))
    if x.size == 0:
        return {"count": 0}
    p50, p90, p95, p99 = np.percentile(x, [50, 90, 95, 99])
    return {"count": int(x.size), "mean": float(x.mean()), "std": float(x.std()), "min": float(x.min()),
            "p50": float(p50), "p90": float(p90), "p95": float(p95), "p99": float(p99), "max": float(x.max())}


@dataclass(frozen=True)
class RequestMetrics:
    """One successful request's latencies in milliseconds (None where undefined)."""

    ttft_ms: float | None
    ttst_ms: float | None
    e2e_ms: float
    tpot_ms: float | None
    chunk_gaps_ms: tuple[float, ...]  # inter-chunk latency of chunks 2..m
    chunk_tokens: tuple[int, ...]  # n_k of chunks 2..m

    @property
    def itl_ms(self) -> tuple[float, ...]:
        """Per-chunk ITL ``ICL_k / n_k`` (one value per chunk; weight it by ``chunk_tokens``)."""
        return tuple(g / n for g, n in zip(self.chunk_gaps_ms, self.chunk_tokens, strict=True))

    @property
    def user_tok_per_s(self) -> float | None:
        return 1000.0 / self.tpot_ms if self.tpot_ms else None


def request_metrics(record: RequestRecord) -> RequestMetrics:
    """The per-request metrics of §4.2.

    Arguments:
        record: a request record (successful or not).
    """
    chunks = record.token_times_ns
    e2e = (record.t_end_ns - record.t_send_ns) / NS_PER_MS
    if not chunks:
        return RequestMetrics(None, None, e2e, None, (), ())
    t_first = chunks[0][0]
    ttft = (t_first - record.t_send_ns) / NS_PER_MS
    ttst = (chunks[1][0] - t_first) / NS_PER_MS if len(chunks) > 1 else None
    gaps = tuple((chunks[k][0] - chunks[k - 1][0]) / NS_PER_MS for k in range(1, len(chunks)))
    tokens = tuple(n for _, n in chunks[1:])
    total = sum(n for _, n in chunks)
    tpot = (chunks[-1][0] - t_first) / NS_PER_MS / (total - 1) if total >= 2 else None
    return RequestMetrics(ttft, ttst, e2e, tpot, gaps, tokens)


def parse_slo(text: str | None) -> dict[str, float]:
    """``"ttft=200,itl=20"`` → ``{"ttft": 200.0, "itl": 20.0}`` (milliseconds).

    ``itl`` and ``tpot`` both bound a request's TPOT (its mean inter-token latency), as GenAI-Perf's
    ``inter_token_latency`` goodput does; ``e2e`` bounds end-to-end latency.

    Arguments:
        text: comma-separated ``key=milliseconds`` pairs, or None.
    """
    if not text:
        return {}
    slo = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        key = key.strip().removesuffix("_ms")
        try:
            number = float(value.removesuffix("ms"))
        except ValueError:
            number = -1.0
        if key not in SLO_KEYS or number <= 0:
            raise KitUsageError(f"--slo part {part!r} is not key=milliseconds with a key in {', '.join(SLO_KEYS)}; "
                                "example: --slo ttft=200,itl=20.")
        slo[key] = number
    return slo


def meets_slo(record: RequestRecord, m: RequestMetrics, slo: dict[str, float]) -> bool:
    """True when the request succeeded with exact OSL and every SLO bound holds.

    Arguments:
        record: the request.
        m: its metrics.
        slo: bounds in milliseconds from ``parse_slo``.
    """
    if not record.ok or record.is_length_mismatch or record.is_server_count_mismatch:
        return False
    checks = {"ttft": m.ttft_ms, "itl": m.tpot_ms, "tpot": m.tpot_ms, "e2e": m.e2e_ms}
    for key, bound in slo.items():
        value = checks[key]
        if value is None and key in ("itl", "tpot"):
            continue  # one output token: no inter-token latency to bound
        if value is None or value > bound:
            return False
    return True


def max_in_flight(records: Sequence[RequestRecord]) -> int:
    """Largest number of requests sent and not yet finished at any instant.

    Arguments:
        records: the requests.
    """
    events = sorted([(r.t_send_ns, 1) for r in records] + [(r.t_end_ns, -1) for r in records],
                    key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


def summarize(records: Sequence[RequestRecord], slo: dict[str, float] | None = None,
              window_ns: tuple[int, int] | None = None, offered_span_ns: int | None = None) -> dict[str, Any]:
    """All aggregates of §4.3 for the measured requests.

    Arguments:
        records: measured requests (warm-up excluded).
        slo: goodput bounds in milliseconds.
        window_ns: ``(T0, T1)``; default: first send to last completion. Open loop: T0 = schedule origin.
        offered_span_ns: open loop: the span the schedule covers (``n / λ``); the achieved send rate is
            ``n / max(span, last send − T0)``, so a pacer that falls behind shows as a lower rate.
    """
    slo = slo or {}
    if not records:
        return {"num_requests": 0}
    t0, t1 = window_ns or (min(r.t_send_ns for r in records), max(r.t_end_ns for r in records))
    seconds = max(t1 - t0, 1) / 1e9
    good = [r for r in records if r.ok]
    per = [(r, request_metrics(r)) for r in good]
    out_tokens = sum(r.osl_observed for r in good)
    in_tokens = sum(r.isl for r in good)
    itl = [(v, n) for _, m in per for v, n in zip(m.itl_ms, m.chunk_tokens, strict=True)]
    users = [m.user_tok_per_s for _, m in per if m.user_tok_per_s is not None]
    met = [(r, m) for r, m in per if meets_slo(r, m, slo)]
    busy = sum(min(r.t_end_ns, t1) - max(r.t_send_ns, t0) for r in records if r.t_end_ns > t0 and r.t_send_ns < t1)
    errors: dict[str, int] = {}
    for r in records:
        if not r.ok:
            errors[r.error_kind or "other"] = errors.get(r.error_kind or "other", 0) + 1
    summary: dict[str, object] = {
        "num_requests": len(records), "num_ok": len(good), "num_errors": len(records) - len(good),
        "errors_by_kind": errors,
        "length_mismatches": sum(r.is_length_mismatch for r in records),
        "server_count_mismatches": sum(r.is_server_count_mismatch for r in records),
        "empty_chunks": sum(1 for r in good for _, n in r.chunks if n == 0),
        "window_s": seconds,
        "request_per_s": len(good) / seconds,
        "output_tok_per_s": out_tokens / seconds,
        "total_tok_per_s": (in_tokens + out_tokens) / seconds,
        "output_tokens": out_tokens,
        "achieved_concurrency": busy / 1e9 / seconds,
        "max_in_flight": max_in_flight(records),
        "ttft_ms": stats([m.ttft_ms for _, m in per if m.ttft_ms is not None]),
        "ttst_ms": stats([m.ttst_ms for _, m in per if m.ttst_ms is not None]),
        "itl_ms": stats([v for v, _ in itl], [n for _, n in itl]),
        "itl_request_max_ms": stats([max(m.itl_ms) for _, m in per if m.itl_ms]),
        "tpot_ms": stats([m.tpot_ms for _, m in per if m.tpot_ms is not None]),
        "e2e_ms": stats([m.e2e_ms for _, m in per]),
        "user_tok_per_s": {**stats(users), "p10": float(np.percentile(users, 10)) if users else None},
        "goodput": {"slo_ms": slo, "request_per_s": len(met) / seconds, "good_fraction": len(met) / len(records),
                    "output_tok_per_s": sum(r.osl_observed for r, _ in met) / seconds},
    }
    queue = [(r.server["first_scheduled_ns"] - r.server["arrival_ns"]) / NS_PER_MS for r in good
             if "first_scheduled_ns" in r.server and "arrival_ns" in r.server]
    if queue:
        summary["server_queue_ms"] = stats(queue)
    speculating = [r for r in good if "drafts" in r.server]
    if speculating:
        drafts, draft_tokens, accepted = (sum(r.server[key] for r in speculating) for key in SPECULATIVE_COUNTS)
        summary["speculative"] = {"num_requests": len(speculating), "drafts": drafts, "draft_tokens": draft_tokens,
                                  "accepted_tokens": accepted,
                                  "acceptance_length": 1 + accepted / drafts if drafts else 1.0}
    lags = [(r.t_send_ns - r.t_scheduled_ns) / NS_PER_MS for r in records if r.t_scheduled_ns is not None]
    if lags and offered_span_ns:
        last_send = max(r.t_send_ns for r in records)
        summary["schedule_lag_ms"] = stats(lags)
        summary["offered_rate_per_s"] = len(records) / (offered_span_ns / 1e9)
        summary["send_rate_per_s"] = len(records) / (max(offered_span_ns, last_send - t0) / 1e9)
        summary["completion_rate_per_s"] = len(good) / seconds
    return summary


def drift(records: Sequence[RequestRecord], num_bins: int = 10) -> dict[str, object]:
    """Soak drift: output tok/s and p99 TPOT per time bin (by completion time) and their slopes per hour;
    failures with their time from the start.

    Arguments:
        records: the measured requests of a long run.
        num_bins: number of equal time bins.
    """
    if len(records) < 2:
        return {}
    t0, t1 = min(r.t_send_ns for r in records), max(r.t_end_ns for r in records)
    width = max(t1 - t0, 1) / num_bins
    bins: list[list[RequestRecord]] = [[] for _ in range(num_bins)]
    for r in records:
        bins[min(int((r.t_end_ns - t0) / width), num_bins - 1)].append(r)
    centers_h = [(i + 0.5) * width / 3.6e12 for i in range(num_bins)]
    tok_s = [sum(r.osl_observed for r in b if r.ok) / (width / 1e9) for b in bins]
    tpots = [[m.tpot_ms for r in b if r.ok and (m := request_metrics(r)).tpot_ms is not None] for b in bins]
    p99 = [float(np.percentile(t, 99)) if t else None for t in tpots]

    def slope(ys: list[float] | list[float | None]) -> float | None:
        points = [(x, y) for x, y in zip(centers_h, ys, strict=True) if y is not None]
        if len(points) < 2:
            return None
        return float(np.polyfit([x for x, _ in points], [y for _, y in points], 1)[0])

    return {"bin_s": width / 1e9, "output_tok_per_s": tok_s, "tpot_p99_ms": p99,
            "output_tok_per_s_slope_per_h": slope(tok_s), "tpot_p99_ms_slope_per_h": slope(p99),
            "failures": [{"t_s": (r.t_end_ns - t0) / 1e9, "kind": r.error_kind, "error": r.error[:200]}
                         for r in records if not r.ok]}
