"""``trtllm-kit bench``: warm-up, measured phases per load level and repeat, telemetry, server metrics,
gates, then the report files. One asyncio event loop drives the client, the pacer and the scraper."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from trtllm_kit.errors import KitError, KitUsageError
from trtllm_kit.profile import loadgen
from trtllm_kit.profile.clients import StreamClient, TritonStreamClient
from trtllm_kit.profile.metrics import drift, stats, summarize
from trtllm_kit.profile.nvml import NvmlSampler, summarize_telemetry
from trtllm_kit.profile.nvtx import nvtx_range
from trtllm_kit.profile.openai_client import OpenAIStreamClient, openai_model_name
from trtllm_kit.profile.prompt_text import text_decoder
from trtllm_kit.profile.records import write_records
from trtllm_kit.profile.report import environment, write_report
from trtllm_kit.profile.triton_metrics import MetricsScraper, window_summary
from trtllm_kit.profile.workload import Prompt, WorkloadSpec, read_jsonl, synthetic_prompts
from trtllm_kit.wire.request import FORCED_LENGTH

DEFAULT_GRPC_URL = "grpc://127.0.0.1:8001"
T_95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
GATE_RATE_TOLERANCE = 0.05
# what a forced output length asks of a server beyond max_tokens, which every server honours: the minimum length
# and no end token (``GenerationRequest.with_length``)
FORCING = "/".join((*(name for name in FORCED_LENGTH if name != "max_tokens"), "end_id"))
REPEATED_METRICS = (("output_tok_per_s", None), ("request_per_s", None), ("ttft_ms", "p50"), ("itl_ms", "p50"),
                    ("tpot_ms", "p50"), ("e2e_ms", "p50"), ("speculative", "acceptance_length"))  # the last: when sent


@dataclass(frozen=True)
class BenchSpec:
    """One benchmark: endpoint, load mode and levels, workload, SLOs and output directory."""

    out: Path
    url: str = DEFAULT_GRPC_URL
    openai_url: str | None = None
    model: str | None = None
    mode: str = "concurrency"
    levels: tuple[float, ...] = (1,)
    num_requests: int | None = None
    duration_s: float | None = None
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    prompts_file: Path | None = None
    warmup_requests: int = 4
    repeats: int = 1
    slo: dict[str, float] = field(default_factory=dict)
    metrics_url: str | None = None
    metrics_url_given: bool = True  # False: inferred from the endpoint, used only if it answers like Triton
    timeout_s: float = 600.0
    plots: bool = True
    tokenizer: Path | None = None  # OpenAI servers that take only text: prompts are decoded with it
    max_loop_lag_ms: float = 20.0  # gate: the client's event-loop lag p99 above it means the client saturated
    api_key: str | None = field(default=None, repr=False)  # OpenAI bearer token; never written to the results

    def __post_init__(self) -> None:
        if self.mode not in loadgen.MODES:
            raise KitUsageError(f"load mode {self.mode!r} is not one of {', '.join(loadgen.MODES)}.")
        if not self.levels or any(v <= 0 for v in self.levels):
            raise KitUsageError(f"load levels must be positive numbers, got {list(self.levels)}.")
        if self.mode == "concurrency" and any(v != int(v) for v in self.levels):
            raise KitUsageError(f"concurrency levels must be whole numbers, got {list(self.levels)}.")
        if self.num_requests is None and self.duration_s is None:
            raise KitUsageError("say how long to measure: --requests N or --duration SECONDS.")
        if self.mode == "offline" and self.num_requests is None:
            raise KitUsageError("--offline submits a fixed set of requests at once; give their number with --requests.")
        if self.repeats < 1:
            raise KitUsageError(f"--repeats must be at least 1, got {self.repeats}.")

    def requests_for(self, level: float) -> int:
        """Measured requests at ``level``: --requests, or enough to last --duration."""
        if self.num_requests is not None:
            return self.num_requests
        assert self.duration_s is not None, "__post_init__ requires --requests or --duration"
        if self.mode == "rate":
            return max(1, math.ceil(level * self.duration_s))
        return 1_000_000  # closed loop stops issuing at the duration

    def label(self, level: float) -> str:
        return f"{self.mode}={level:g}"


class PromptSource:
    """Hands out disjoint prompts: generated on demand, or taken in turn from a prompt file."""

    def __init__(self, spec: BenchSpec) -> None:
        self.spec, self.next_number = spec, 0
        self.fixed = read_jsonl(spec.prompts_file) if spec.prompts_file else None

    def take(self, count: int, prefix: str) -> list[Prompt]:
        first, self.next_number = self.next_number, self.next_number + count
        if self.fixed is None:
            return synthetic_prompts(self.spec.workload, count, first, prefix)
        return [Prompt(f"{prefix}{i}", p.input_ids, p.osl)
                for i, p in ((i, self.fixed[i % len(self.fixed)]) for i in range(first, first + count))]

    def stream(self, prefix: str, chunk: int = 256):
        while True:
            yield from self.take(chunk, prefix)


def gates(spec: BenchSpec, level: float, summary: dict[str, Any], loop_lag: dict[str, Any],
          server: dict[str, Any] | None, telemetry: dict[str, Any] | None) -> list[str]:
    """Reasons a point is invalid (``docs/harness.md`` §10); empty when it is valid.

    Arguments:
        spec: the benchmark.
        level: concurrency or rate of the point.
        summary: from ``metrics.summarize``.
        loop_lag: stats of the client's event-loop lag.
        server: window summary of Triton metrics, if scraped.
        telemetry: NVML window summary, if sampled.
    """
    failed = []
    if summary["num_errors"]:
        failed.append(f"{summary['num_errors']} failed requests {summary['errors_by_kind']}: the figures would count "
                      "only the requests that succeeded (raise --timeout if they timed out)")
    if summary["length_mismatches"] or summary["server_count_mismatches"]:
        failed.append(f"{summary['length_mismatches']} output-length mismatches, "
                      f"{summary['server_count_mismatches']} client/server count mismatches: tok/s and TPOT would "
                      f"divide by the wrong token counts (the server ignores {FORCING}, or --vocab-size is above "
                      "the model's)")
    if (server and server.get("model") and server.get("request_success") is not None
            and server["request_success"] != summary["num_ok"]):
        failed.append(f"server counted {server['request_success']:g} successes, client {summary['num_ok']}: another "
                      "client shared the server, so its figures are not this load's (or pass --metrics-url of the "
                      "right server)")
    if spec.mode == "concurrency" and summary["num_requests"] >= level and summary["max_in_flight"] != int(level):
        failed.append(f"max in flight {summary['max_in_flight']} differs from concurrency {level:g}: the point did "
                      "not measure that load (lower --concurrency or raise --timeout)")
    if spec.mode == "rate" and abs(summary["send_rate_per_s"] / level - 1) > GATE_RATE_TOLERANCE:
        failed.append(f"achieved send rate {summary['send_rate_per_s']:.3g}/s is not within 5 % of {level:g}/s: the "
                      "latencies belong to another rate (lower --rate, or give --duration long enough for the "
                      "Poisson draws to average out)")
    if loop_lag.get("p99", 0) > spec.max_loop_lag_ms:
        failed.append(f"client event-loop lag p99 {loop_lag['p99']:.1f} ms is above --max-client-lag "
                      f"{spec.max_loop_lag_ms:g} ms: the load generator is saturated and adds up to that much to "
                      "every TTFT and ITL it measures (on a small client machine raise --max-client-lag, knowing "
                      "the latencies carry that error, or lower --concurrency)")
    if telemetry and telemetry.get("num_samples"):
        if not telemetry["valid"]:
            failed.append(f"GPU clock throttling: {', '.join(telemetry['throttle_invalidating'])}: the GPU ran "
                          "below its clocks, so throughput is understated (no flag relaxes this: cool the GPU or "
                          "lift its power cap)")
        if telemetry["coverage"] < 0.95:
            failed.append(f"telemetry covers {telemetry['coverage']:.0%} of the expected 10 Hz samples: energy and "
                          "clock figures would miss part of the window (the client machine is overloaded: lower "
                          "--concurrency)")
    return failed


def across_repeats(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean, 95 % t-interval half-width and coefficient of variation of the headline metrics over repeats.

    Arguments:
        runs: per-repeat summaries of one level.
    """
    out = {}
    for name, stat in REPEATED_METRICS:
        values = [r[name] if stat is None else r.get(name, {}).get(stat) for r in runs]
        values = [v for v in values if v is not None]
        if not values:
            continue
        s = stats(values)
        n = len(values)
        sd = s["std"] * math.sqrt(n / (n - 1)) if n > 1 else 0.0
        half = T_95.get(n - 1, 1.96) * sd / math.sqrt(n) if n > 1 else None
        out[f"{name}{'_' + stat if stat else ''}"] = {"mean": s["mean"], "ci95": half, "n": n,
                                                     "cv": sd / s["mean"] if s["mean"] else None}
    return out


async def _measure(spec: BenchSpec, client: StreamClient, prompts: PromptSource, sampler: NvmlSampler,
                   scraper: MetricsScraper | None, on_done: Any, triton_model: str | None) -> list[dict[str, Any]]:
    runs = []
    records_path = spec.out / "requests.jsonl"
    for level in spec.levels:
        for repeat in range(spec.repeats):
            label = spec.label(level)
            with nvtx_range(f"warmup/{label}"):
                await loadgen.warm_up(client, prompts.take(spec.warmup_requests, f"w{label}.{repeat}."),
                                      int(level) if spec.mode == "concurrency" else 4)
            before = await scraper.scrape() if scraper else None
            if scraper:
                scraper.start()
            count = spec.requests_for(level)
            with nvtx_range(f"measure/{label}/repeat/{repeat}"):
                if spec.mode == "rate":
                    phase = await loadgen.open_loop(client, prompts.take(count, f"{label}.{repeat}."), level,
                                                    spec.workload.seed + repeat, on_done, label)
                elif spec.mode == "offline":
                    phase = await loadgen.offline(client, prompts.take(count, f"{label}.{repeat}."), on_done, label)
                else:
                    source = (prompts.take(count, f"{label}.{repeat}.") if spec.num_requests is not None
                              else prompts.stream(f"{label}.{repeat}."))
                    phase = await loadgen.closed_loop(client, source, int(level), spec.duration_s, on_done, label)
            server = None
            if scraper:
                scraper.stop()
                after = await scraper.scrape()
                during = [s for s in scraper.snapshots if before and after and
                          before.t_mono_ns < s.t_mono_ns < after.t_mono_ns]
                server = window_summary(before, after, during, triton_model) if before and after else None
            for r in phase.records:
                r.scenario, r.repeat = f"isl{spec.workload.isl}_osl{spec.workload.osl}", repeat
            write_records(phase.records, records_path)
            summary = summarize(phase.records, spec.slo, phase.window_ns, phase.offered_span_ns)
            telemetry = (summarize_telemetry(sampler.samples, phase.window_ns, int(summary.get("output_tokens", 0)),
                                             int(summary.get("num_ok", 0))) if sampler.available else None)
            lag = stats(phase.loop_lag_ms)
            failed = gates(spec, level, summary, lag, server, telemetry)
            runs.append({"level": level, "label": label, "repeat": repeat, "window_ns": list(phase.window_ns),
                         **summary, "client_loop_lag_ms": lag, "server_metrics": server, "telemetry": telemetry,
                         "drift": drift(phase.records) if spec.duration_s else None,
                         "valid": not failed, "invalid_reasons": failed})
    return runs


async def run_bench_async(spec: BenchSpec, on_done: Any = None, sampler: NvmlSampler | None = None) -> dict[str, Any]:
    """Measure every level and repeat; returns the results (also written by ``report.write_report``).

    Arguments:
        spec: the benchmark.
        on_done: called with each finished measured record (progress display).
        sampler: an NVML sampler (default: a real one; it reports why when NVML is unavailable).
    """
    spec.out.mkdir(parents=True, exist_ok=True)
    (spec.out / "requests.jsonl").unlink(missing_ok=True)
    client, model = await open_client(spec)
    notes = []
    scraper = MetricsScraper(spec.metrics_url) if spec.metrics_url else None
    if scraper and not spec.metrics_url_given and not await scraper.probe():
        notes.append(f"no Triton metrics are scraped ({scraper.error}); pass --metrics-url http://HOST:PORT/metrics "
                     "for queue time and KV-cache figures.")
        scraper = None
    sampler = sampler or NvmlSampler()
    sampler.start()
    try:
        # the server/client success gate needs the Triton model the client calls (unknown behind OpenAI)
        runs = await _measure(spec, client, PromptSource(spec), sampler, scraper, on_done,
                              None if spec.openai_url else model)
    finally:
        sampler.stop()
        await client.close()
    by_level: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        by_level.setdefault(run["label"], []).append(run)
    recorded = {key: value for key, value in asdict(spec).items() if key != "api_key"}
    results = {"spec": {**recorded, "model": model}, "environment": environment(sampler),
               "clock": {"wall_minus_monotonic_ns": time.time_ns() - time.monotonic_ns()},
               "nvml": "available" if sampler.available else f"NVML unavailable: {sampler.unavailable}",
               "notes": notes, "runs": runs, "levels": {k: across_repeats(v) for k, v in by_level.items()},
               "valid": all(r["valid"] for r in runs)}
    return write_report(results, spec.out, sampler, scraper, plots=spec.plots)


async def open_client(spec: BenchSpec) -> tuple[StreamClient, str]:
    """The streaming client of the measured endpoint (OpenAI or Triton gRPC, checked ready) and its model name.

    Arguments:
        spec: the benchmark (its endpoint, model, timeout, tokenizer and key are read).
    """
    if spec.openai_url:
        model = spec.model or await openai_model_name(spec.openai_url, spec.api_key)
        return OpenAIStreamClient(spec.openai_url, model, spec.timeout_s,
                                  text_decoder(spec.tokenizer) if spec.tokenizer else None, spec.api_key), model
    model = spec.model or "tensorrt_llm"
    client = TritonStreamClient(spec.url, model, spec.timeout_s)
    try:
        await client.check_ready()
    except KitError:
        await client.close()
        raise
    return client, model


def default_metrics_url(endpoint: str) -> str:
    """Triton's metrics next to ``endpoint``: the same host, port 8002 (where ``trtllm-kit serve`` and
    tritonserver put them by default).

    Arguments:
        endpoint: the gRPC or OpenAI URL being measured.
    """
    host = urlsplit(endpoint if "://" in endpoint else f"grpc://{endpoint}").hostname or "127.0.0.1"
    return f"http://{f'[{host}]' if ':' in host else host}:8002/metrics"


def run_bench(spec: BenchSpec, on_done: Any = None) -> dict[str, Any]:
    """Synchronous entry point for the CLI.

    Arguments:
        spec: the benchmark.
        on_done: progress callback per finished record.
    """
    return asyncio.run(run_bench_async(spec, on_done))
