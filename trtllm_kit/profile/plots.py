"""PNG plots (matplotlib, Agg backend): latency vs load, throughput vs per-user speed, TTFT and ITL CDFs,
GPU telemetry and server queue / KV cache over time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from trtllm_kit.profile.metrics import request_metrics
from trtllm_kit.profile.records import read_records


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt, *plt.subplots(figsize=(6.4, 4.0), dpi=100)


def _save(plt: Any, fig: Any, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path.name


def latency_vs_load(results: dict[str, Any], path: Path) -> str:
    """TTFT and TPOT p50/p99 against the load level (first repeat of each level)."""
    plt, fig, ax = _figure()
    runs = [r for r in results["runs"] if r["repeat"] == 0]
    x = [r["level"] for r in runs]
    for metric, style in (("ttft_ms", "o-"), ("tpot_ms", "s--")):
        for stat in ("p50", "p99"):
            ax.plot(x, [r[metric].get(stat, np.nan) for r in runs], style, label=f"{metric[:-3].upper()} {stat}")
    ax.set_xlabel(results["spec"]["mode"])
    ax.set_ylabel("ms")
    ax.set_yscale("log")
    ax.legend()
    ax.set_title("Latency vs load")
    return _save(plt, fig, path)


def throughput_vs_user(results: dict[str, Any], path: Path) -> str:
    """Output tok/s against mean tok/s/user, one point per level (the Pareto view)."""
    plt, fig, ax = _figure()
    runs = [r for r in results["runs"] if r["repeat"] == 0]
    users = [r["user_tok_per_s"].get("mean", np.nan) for r in runs]
    ax.plot(users, [r["output_tok_per_s"] for r in runs], "o-")
    for r, u in zip(runs, users, strict=True):
        ax.annotate(f"{r['level']:g}", (u, r["output_tok_per_s"]))
    ax.set_xlabel("output tok/s per user")
    ax.set_ylabel("output tok/s")
    ax.set_title("Throughput vs per-user speed")
    return _save(plt, fig, path)


def cdfs(records_path: Path, out: Path) -> list[str]:
    """TTFT and per-chunk ITL CDFs, one curve per level."""
    by_level: dict[str, tuple[list[float], list[float]]] = {}
    for record in read_records(records_path):
        if not record.ok:
            continue
        m = request_metrics(record)
        ttft, itl = by_level.setdefault(record.level, ([], []))
        if m.ttft_ms is not None:
            ttft.append(m.ttft_ms)
        for value, n in zip(m.itl_ms, m.chunk_tokens, strict=True):
            itl.extend([value] * n)
    names = []
    for index, title in ((0, "TTFT"), (1, "ITL")):
        plt, fig, ax = _figure()
        for level, series in by_level.items():
            values = np.sort(series[index])
            if values.size:
                ax.plot(values, np.arange(1, values.size + 1) / values.size, label=level)
        ax.set_xlabel(f"{title} ms")
        ax.set_ylabel("fraction of samples")
        ax.legend()
        ax.set_title(f"{title} CDF")
        names.append(_save(plt, fig, out / f"{title.lower()}_cdf.png"))
    return names


def telemetry(samples: list[Any], path: Path) -> str:
    """Instant power and SM clock over time, per GPU."""
    plt, fig, ax = _figure()
    t0 = min(s.t_mono_ns for s in samples)
    ax2 = ax.twinx()
    for gpu in sorted({s.gpu for s in samples}):
        mine = [s for s in samples if s.gpu == gpu]
        t = [(s.t_mono_ns - t0) / 1e9 for s in mine]
        ax.plot(t, [(s.power_instant_mw or np.nan) / 1000 for s in mine], label=f"GPU{gpu} W")
        ax2.plot(t, [s.sm_clock_mhz or np.nan for s in mine], ":", label=f"GPU{gpu} SM MHz")
    ax.set_xlabel("s")
    ax.set_ylabel("W")
    ax2.set_ylabel("MHz")
    ax.set_title("GPU power and SM clock")
    return _save(plt, fig, path)


def server_metrics(snapshots: list[Any], path: Path) -> str:
    """Pending requests, TensorRT-LLM active/waiting requests and KV-cache utilization over time."""
    plt, fig, ax = _figure()
    t0 = snapshots[0].t_mono_ns
    t = [(s.t_mono_ns - t0) / 1e9 for s in snapshots]
    ax.plot(t, [s.total("nv_inference_pending_request_count") for s in snapshots], label="pending")
    for kind in ("active", "waiting"):
        ax.plot(t, [s.series("nv_trt_llm_request_metrics", "request_type").get(kind, np.nan) for s in snapshots],
                label=kind)
    kv = [s.series("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type") for s in snapshots]
    ax2 = ax.twinx()
    ax2.plot(t, [k["used"] / k["max"] if k.get("max") else np.nan for k in kv], ":", color="gray", label="KV used")
    ax2.set_ylim(0, 1)
    ax2.set_ylabel("KV blocks used / max")
    ax.set_xlabel("s")
    ax.set_ylabel("requests")
    ax.legend(loc="upper left")
    ax.set_title("Server queue and KV cache")
    return _save(plt, fig, path)


def draw_all(results: dict[str, Any], out: Path, samples: list[Any], snapshots: list[Any] | None = None) -> list[str]:
    """Every plot that has data; returns the PNG file names.

    Arguments:
        results: the results dictionary.
        out: the output directory (holds requests.jsonl).
        samples: NVML samples.
        snapshots: Triton metrics scrapes.
    """
    names = [latency_vs_load(results, out / "latency_vs_load.png"),
             throughput_vs_user(results, out / "throughput_vs_user.png")]
    if (out / "requests.jsonl").is_file():
        names += cdfs(out / "requests.jsonl", out)
    if samples:
        names.append(telemetry(samples, out / "telemetry.png"))
    if snapshots and len(snapshots) > 1:
        names.append(server_metrics(snapshots, out / "server_metrics.png"))
    return names
