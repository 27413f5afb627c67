"""The ``bench``, ``bench compare`` and ``profile`` commands (registered by ``cli.py``): flags → BenchSpec →
one library call → print."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from trtllm_kit.errors import KitError, KitUsageError
from trtllm_kit.names import API_KEY_ENV
from trtllm_kit.profile.cold_start_command import cold_start
from trtllm_kit.profile.shared_prefix_command import FLAGS as SHARED_PREFIX_FLAGS
from trtllm_kit.profile.shared_prefix_command import bench_shared_prefix, shared_prefix_options

# Each command imports the library inside its function, so that `trtllm-kit --help` and every command load
# only what they run (torch, transformers, tritonclient and matplotlib take seconds to import).


def _numbers(text: str | None, flag: str) -> tuple[float, ...]:
    if not text:
        return ()
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise KitUsageError(f"{flag} {text!r} is not a comma-separated list of numbers; "
                            f"example: {flag} 1,4,16.") from None


def load_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The endpoint, load and workload flags shared by ``bench`` and ``profile``."""
    options = [
        click.option("--url", default="grpc://127.0.0.1:8001", show_default=True,
                     help="Triton gRPC endpoint (calls the tensorrt_llm model with token ids)."),
        click.option("--openai-url", help="OpenAI-compatible base URL instead, e.g. http://127.0.0.1:9000/v1."),
        click.option("--model", help="Model name (default: tensorrt_llm; OpenAI: the first listed)."),
        click.option("--concurrency", help="Closed loop: comma-separated requests in flight, e.g. 1,4,16."),
        click.option("--rate", help="Open loop: comma-separated Poisson request rates per second, e.g. 2,8."),
        click.option("--offline", is_flag=True, help="Submit every request at once."),
        click.option("--requests", "num_requests", type=int, help="Measured requests per point."),
        click.option("--duration", "duration_s", type=float, help="Seconds per point (soak: a long duration)."),
        click.option("--isl", type=int, default=128, show_default=True, help="Input tokens per request."),
        click.option("--osl", type=int, default=128, show_default=True, help="Output tokens per request (forced)."),
        click.option("--isl-std", type=float, default=0.0, help="Stddev of a normal ISL distribution."),
        click.option("--osl-std", type=float, default=0.0, help="Stddev of a normal OSL distribution."),
        click.option("--vocab-size", type=int, default=1000, show_default=True, help="Prompt ids are below it."),
        click.option("--prompts", "prompts_file", type=click.Path(path_type=Path), help="A .jsonl prompt file."),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--warmup", "warmup_requests", type=int, default=4, show_default=True,
                     help="Untimed requests before every point."),
        click.option("--repeats", type=int, default=1, show_default=True, help="Repeats per point (≥ 3 for CIs)."),
        click.option("--slo", help="Goodput bounds in ms, e.g. ttft=200,itl=20 (also tpot, e2e)."),
        click.option("--metrics-url", help="Triton /metrics (default: port 8002 on the endpoint's host, if it "
                                           "answers there)."),
        click.option("--timeout", "timeout_s", type=float, default=600.0, show_default=True,
                     help="Seconds per request."),
        click.option("--no-plots", is_flag=True, help="Skip the PNG plots."),
        click.option("--max-client-lag", "max_loop_lag_ms", type=float, default=20.0, show_default=True,
                     help="Gate: the client's event-loop lag p99 (ms) above which a point is invalid."),
        click.option("--api-key", envvar=API_KEY_ENV,
                     help=f"OpenAI servers that want 'Authorization: Bearer KEY' (env {API_KEY_ENV}); never "
                     "written to the results."),
        click.option("--tokenizer", type=click.Path(path_type=Path),
                     help="OpenAI servers that take only text prompts: decode the prompt ids with this tokenizer."),
        click.option("--out", type=click.Path(path_type=Path), required=True, help="Result directory."),
        click.option("--json", "as_json", is_flag=True, help="Print the results as JSON."),
    ]
    return functools.reduce(lambda f, option: option(f), reversed(options), fn)


def bench_spec(values: dict[str, Any]) -> Any:
    """A ``BenchSpec`` from the load flags."""
    from trtllm_kit.profile.bench import BenchSpec, default_metrics_url
    from trtllm_kit.profile.metrics import parse_slo
    from trtllm_kit.profile.workload import WorkloadSpec

    if values["out"] is None:
        raise KitUsageError("no result directory given; pass --out DIR.")
    concurrency, rate = _numbers(values["concurrency"], "--concurrency"), _numbers(values["rate"], "--rate")
    if sum(bool(x) for x in (concurrency, rate, values["offline"])) > 1:
        raise KitUsageError("choose one load mode: --concurrency, --rate or --offline.")
    mode, levels = ("rate", rate) if rate else ("offline", (1.0,)) if values["offline"] else (
        "concurrency", concurrency or (1.0,))
    metrics_url = values["metrics_url"] or default_metrics_url(values["openai_url"] or values["url"])
    workload = WorkloadSpec(isl=values["isl"], osl=values["osl"], isl_std=values["isl_std"],
                            osl_std=values["osl_std"], vocab_size=values["vocab_size"], seed=values["seed"])
    return BenchSpec(out=values["out"], url=values["url"], openai_url=values["openai_url"], model=values["model"],
                     mode=mode, levels=levels, num_requests=values["num_requests"], duration_s=values["duration_s"],
                     workload=workload, prompts_file=values["prompts_file"],
                     warmup_requests=values["warmup_requests"], repeats=values["repeats"],
                     slo=parse_slo(values["slo"]), metrics_url=metrics_url,
                     metrics_url_given=values["metrics_url"] is not None, timeout_s=values["timeout_s"],
                     plots=not values["no_plots"], tokenizer=values["tokenizer"],
                     max_loop_lag_ms=values["max_loop_lag_ms"], api_key=values["api_key"])


class Progress:
    """A live line on stderr: finished requests, errors, elapsed time."""

    def __init__(self, enabled: bool) -> None:
        from rich.console import Console
        from rich.live import Live

        self.done = self.errors = 0
        self.live = Live("", console=Console(stderr=True), transient=True, refresh_per_second=4) if enabled else None

    def __call__(self, record: Any) -> None:
        self.done += 1
        self.errors += not record.ok
        if self.live:
            self.live.update(f"{record.level}: {self.done} requests done, {self.errors} errors")

    def __enter__(self) -> Progress:
        if self.live:
            self.live.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.live:
            self.live.stop()


def _print_results(results: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(results, indent=2, default=str))
    else:
        for note in results["notes"]:
            click.echo(f"note: {note}", err=True)
        click.echo(results["nvml"] if results["nvml"] != "available" else "NVML: sampling at 10 Hz")
        for run in results["runs"]:
            p50 = {key: run[key].get("p50", float("nan")) for key in ("ttft_ms", "itl_ms", "tpot_ms")}.get
            click.echo(f"{run['label']:>16} #{run['repeat']}: {run['request_per_s']:8.2f} req/s "
                       f"{run['output_tok_per_s']:10.1f} out tok/s  TTFT p50 {p50('ttft_ms'):8.2f} ms  "
                       f"ITL p50 {p50('itl_ms'):7.2f} ms  TPOT p50 {p50('tpot_ms'):7.2f} ms  "
                       f"n={run['num_requests']}{'' if run['valid'] else '  INVALID'}")
        click.echo(f"wrote {Path(results['spec']['out']) / results['files']['summary']}")
    invalid = [f"{r['label']} #{r['repeat']}: {'; '.join(r['invalid_reasons'])}" for r in results["runs"]
               if not r["valid"]]
    if invalid:
        raise KitError(f"{len(invalid)} of {len(results['runs'])} points failed their sanity gates "
                       f"({' | '.join(invalid)}); the results are in {results['spec']['out']}.")


@click.group(invoke_without_command=True, context_settings={"ignore_unknown_options": False})
@load_options
@click.option("--phases", is_flag=True, help="Measure the two phases instead (prefill tokens/s at --prefill-batch, "
              "decode tokens/s per sequence at --decode-concurrency; KV transfer ms per request from a serve "
              "--disagg's --metrics-url) into OUT/phases.json for plan --disagg --phases.")
@click.option("--prefill-batch", type=int, default=4, show_default=True, help="Prefill requests at once (--phases).")
@click.option("--decode-concurrency", type=int, default=4, show_default=True,
              help="Decoding sequences at once (--phases).")
@shared_prefix_options
@click.pass_context
def bench(ctx: click.Context, as_json: bool, **values: Any) -> None:
    """Measure a running endpoint: TTFT, ITL, TPOT, throughput, goodput; write a report to --out.

    \b
    Examples:
      trtllm-kit bench --concurrency 1,4,16 --requests 200 --isl 128 --osl 128 --out results/
      trtllm-kit bench --rate 2,8 --duration 60 --slo ttft=200,itl=20 --out results/
      trtllm-kit bench --openai-url http://127.0.0.1:9000/v1 --concurrency 8 --requests 100 --out results/
      trtllm-kit bench compare base/summary.json new/summary.json --max-regression 5%
      trtllm-kit bench --phases --openai-url http://127.0.0.1:9000/v1 --isl 512 --osl 64 --out phases/
      trtllm-kit bench --workload shared-prefix --prefixes 4 --users 16 --openai-url http://127.0.0.1:8000/v1 --out sp/
    """
    if ctx.invoked_subcommand is not None:
        return
    from trtllm_kit.profile.bench import run_bench

    if values.pop("phases"):
        _bench_phases(values, as_json)
        return
    if values["workload"] == "shared-prefix":
        bench_shared_prefix(values, as_json)
        return
    values.pop("prefill_batch"), values.pop("decode_concurrency")
    for flag in SHARED_PREFIX_FLAGS:
        values.pop(flag)
    spec = bench_spec(values)
    with Progress(not as_json) as progress:
        results = run_bench(spec, progress)
    _print_results(results, as_json)


def _bench_phases(values: dict[str, Any], as_json: bool) -> None:
    from trtllm_kit.profile.bench import open_client
    from trtllm_kit.profile.phases import PHASES_FILE, PhasesSpec, run_phases

    if values["out"] is None:
        raise KitUsageError("no result directory given; pass --out DIR.")
    spec = PhasesSpec(out=values["out"], isl=values["isl"], osl=values["osl"], prefill_batch=values["prefill_batch"],
                      decode_concurrency=values["decode_concurrency"], rounds=values["repeats"],
                      warmup=values["warmup_requests"], vocab_size=values["vocab_size"],
                      seed=values["seed"], metrics_url=values["metrics_url"])

    async def client() -> Any:
        return (await open_client(bench_spec({**values, "num_requests": 1})))[0]

    phases = run_phases(spec, client)
    if as_json:
        click.echo(json.dumps(asdict(phases), indent=2))
        return
    transfer = "" if phases.kv_transfer_ms_per_request is None else \
        f"; KV transfer {phases.kv_transfer_ms_per_request:.2f} ms per request ({phases.num_kv_transfers} transfers)"
    click.echo(f"prefill {phases.prefill_tokens_s:,.0f} tokens/s at batch {phases.prefill_batch} x ISL {phases.isl} "
               f"(TTFT p50 {phases.ttft_ms_p50:.1f} ms); decode {phases.decode_tokens_s_per_seq:,.1f} tokens/s per "
               f"sequence at concurrency {phases.decode_concurrency} (ITL p50 {phases.itl_ms_p50:.2f} ms){transfer}")
    click.echo(f"wrote {spec.out / PHASES_FILE}")


# ``bench compare`` must not require bench's --out.
bench.params = [p for p in bench.params if p.name != "out"] + [
    click.Option(["--out"], type=click.Path(path_type=Path), help="Result directory (required to measure).")]


bench.add_command(cold_start)


@bench.command()
@click.argument("base", type=click.Path(path_type=Path))
@click.argument("new", type=click.Path(path_type=Path))
@click.option("--max-regression", default="5%", show_default=True, help="Allowed worsening of every metric.")
@click.option("--threshold", "thresholds", multiple=True, help="Per metric, e.g. ttft_ms_p50=10%.")
@click.option("--json", "as_json", is_flag=True, help="Print the deltas as JSON.")
def compare(base: Path, new: Path, max_regression: str, thresholds: tuple[str, ...], as_json: bool) -> None:
    """Compare two benchmark results; exit 1 on a regression beyond the threshold (CI gate).

    \b
    Example:
      trtllm-kit bench compare base/summary.json new/summary.json --max-regression 5%
      trtllm-kit bench --phases --openai-url http://127.0.0.1:9000/v1 --isl 512 --osl 64 --out phases/
    """
    from dataclasses import asdict

    from trtllm_kit.profile.compare import compare_files, format_table

    result = compare_files(base, new, max_regression, thresholds)
    if as_json:
        click.echo(json.dumps({"deltas": [asdict(d) for d in result.deltas], "notes": result.notes,
                               "failed": result.failed}, indent=2))
    else:
        click.echo(format_table(result.deltas))
        for note in result.notes:
            click.echo(f"note: {note}")
    if result.failed:
        regressed = [f"{d.level} {d.metric} {d.change:+.1%}" for d in result.deltas if d.regressed]
        raise KitError(f"regression against {base}: {', '.join(regressed) or 'the new results are invalid'}.")


@click.command(context_settings={"ignore_unknown_options": True})
@load_options
@click.option("--iterations", default="100-150", show_default=True,
              help="Engine iterations to capture (TLLM_PROFILE_START_STOP).")
@click.option("--ready-url", default="http://127.0.0.1:8000/v2/health/ready", show_default=True,
              help="Polled until the server answers 200.")
@click.option("--ready-timeout", type=float, default=600.0, show_default=True)
@click.argument("server_argv", nargs=-1, type=click.UNPROCESSED)
def profile(as_json: bool, iterations: str, ready_url: str, ready_timeout: float, server_argv: tuple[str, ...],
            **values: Any) -> None:
    """Run SERVER_ARGV under `nsys profile` capturing engine iterations, drive the load, summarise the trace.

    \b
    Example:
      trtllm-kit profile --concurrency 8 --requests 200 --out prof/ -- tritonserver --model-repository out/repo
    """
    from trtllm_kit.profile.nsys import parse_iterations, run_profile

    window = parse_iterations(iterations)
    spec = bench_spec(values)
    with Progress(not as_json) as progress:
        summary = run_profile(spec, list(server_argv), ready_url, window, ready_timeout, progress)
    if as_json:
        click.echo(json.dumps(summary, indent=2, default=str))
        return
    inside = {True: "inside the measured phase", False: "NOT inside the measured phase (choose --iterations from "
              "server_metrics.csv)", None: "not checked (no iteration counter)"}[summary["capture_in_measurement"]]
    click.echo(f"trace {spec.out / summary['report']}, capture window {iterations} {inside}; top kernels:")
    for kernel in summary["top_kernels"][:5]:
        click.echo(f"  {kernel['total_ms']:10.2f} ms  {kernel['instances']:7d}x  {kernel['name'][:90]}")
    for name, ms in sorted(summary["kernel_ms_by_category"].items(), key=lambda kv: -kv[1]):
        click.echo(f"  {name:<12} {ms:10.2f} ms")
