"""Result files of a benchmark: ``summary.json`` (schema_version, spec, environment, per-run summaries,
raw-record file names), ``summary.csv`` (long form), ``telemetry.csv``, ``server_metrics.csv``, PNG plots
and ``report.md``."""

from __future__ import annotations

import csv
import json
import os
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from trtllm_kit import __version__
from trtllm_kit.errors import KitError
from trtllm_kit.profile.nvml import TELEMETRY_COLUMNS
from trtllm_kit.profile.plots import draw_all

SCHEMA_VERSION = "1.0"
PACKAGES = ("tritonclient", "grpcio", "aiohttp", "numpy", "nvidia-ml-py", "prometheus-client", "matplotlib",
            "nvidia-pytriton", "tensorrt-llm", "tensorrt")
FILES = {"records": "requests.jsonl", "summary": "summary.json", "csv": "summary.csv",
         "telemetry": "telemetry.csv", "server_metrics": "server_metrics.csv", "markdown": "report.md"}
CSV_METRICS = ("ttft_ms", "ttst_ms", "itl_ms", "tpot_ms", "e2e_ms", "user_tok_per_s", "schedule_lag_ms",
               "server_queue_ms", "client_loop_lag_ms")
SCALARS = (("request_per_s", "1/s"), ("output_tok_per_s", "tok/s"), ("total_tok_per_s", "tok/s"),
           ("achieved_concurrency", "requests"), ("max_in_flight", "requests"), ("num_errors", "requests"),
           ("length_mismatches", "requests"), ("send_rate_per_s", "1/s"), ("offered_rate_per_s", "1/s"),
           ("window_s", "s"))


def _git_revision() -> str | None:
    try:
        proc = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                              text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() or None


def environment(sampler: Any = None) -> dict[str, Any]:
    """Versions, host, GPUs and driver (from the NVML sampler when it has them).

    Arguments:
        sampler: an ``NvmlSampler`` or None.
    """
    versions = {"trtllm-kit": __version__}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    gpus = list(getattr(sampler, "devices", []) or [])
    return {"versions": versions, "python": platform.python_version(), "platform": platform.platform(),
            "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
            "git_revision": _git_revision(), "gpus": gpus, "driver": gpus[0]["driver"] if gpus else None,
            "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def csv_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Long form: run_id, scenario, level, repeat, metric, stat, value, unit.

    Arguments:
        results: the results dictionary.
    """
    rows = []
    for run in results["runs"]:
        base = {"run_id": f"{run['label']}#{run['repeat']}", "scenario": results["spec"]["mode"],
                "level": run["level"], "repeat": run["repeat"]}
        for name, unit in SCALARS:
            if run.get(name) is not None:
                rows.append({**base, "metric": name, "stat": "value", "value": run[name], "unit": unit})
        for name in CSV_METRICS:
            for stat, value in (run.get(name) or {}).items():
                if value is not None:
                    unit = "count" if stat == "count" else "tok/s" if name == "user_tok_per_s" else "ms"
                    rows.append({**base, "metric": name, "stat": stat, "value": value, "unit": unit})
        goodput = run.get("goodput") or {}
        for stat in ("request_per_s", "good_fraction", "output_tok_per_s"):
            if stat in goodput:
                rows.append({**base, "metric": "goodput", "stat": stat, "value": goodput[stat], "unit": ""})
    return rows


def _write_csv(path: Path, rows: list[dict[str, Any]], columns: list[str]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def _fmt(stat: dict[str, Any] | None, key: str = "p50") -> str:
    return f"{stat[key]:.2f}" if stat and stat.get(key) is not None else "–"


def markdown(results: dict[str, Any], plots: list[str]) -> str:
    """The human report: environment, one table row per run, gates, plot links.

    Arguments:
        results: the results dictionary.
        plots: PNG file names.
    """
    spec, env = results["spec"], results["environment"]
    lines = [f"# trtllm-kit bench: {spec['mode']} {', '.join(f'{v:g}' for v in spec['levels'])}", "",
             f"Endpoint `{spec['openai_url'] or spec['url']}`, model `{spec['model']}`, ISL/OSL "
             f"{spec['workload']['isl']}/{spec['workload']['osl']}, seed {spec['workload']['seed']}; "
             f"trtllm-kit {env['versions']['trtllm-kit']} ({env['git_revision'] or 'no git'}), "
             f"{env['cpu_count']} CPUs, GPUs: {', '.join(g['name'] or '?' for g in env['gpus']) or 'none'}; "
             f"{results['nvml']}.", "", *(line for note in results.get("notes", ()) for line in (f"Note: {note}", "")),
             "| run | req/s | out tok/s | TTFT p50/p99 ms | ITL p50/p99 ms | TPOT p50 ms | E2E p50 ms | tok/s/user "
             "| goodput req/s | n | valid |", "|" + "---|" * 11]
    for run in results["runs"]:
        lines.append(f"| {run['label']} #{run['repeat']} | {run['request_per_s']:.2f} | {run['output_tok_per_s']:.1f} "
                     f"| {_fmt(run['ttft_ms'])} / {_fmt(run['ttft_ms'], 'p99')} | {_fmt(run['itl_ms'])} / "
                     f"{_fmt(run['itl_ms'], 'p99')} | {_fmt(run['tpot_ms'])} | {_fmt(run['e2e_ms'])} | "
                     f"{_fmt(run['user_tok_per_s'], 'mean')} | {run['goodput']['request_per_s']:.2f} | "
                     f"{run['num_requests']} | {'yes' if run['valid'] else 'no'} |")
    speculating = [(run, run["speculative"]) for run in results["runs"] if "speculative" in run]
    if speculating:
        lines += ["", "Speculative decoding (the server's `usage.speculative`): " + "; ".join(
            f"{run['label']} #{run['repeat']} acceptance length {spec['acceptance_length']:.2f} "
            f"({spec['accepted_tokens']} of {spec['draft_tokens']} draft tokens accepted)"
            for run, spec in speculating)]
    invalid = [f"- {r['label']} #{r['repeat']}: {'; '.join(r['invalid_reasons'])}" for r in results["runs"]
               if not r["valid"]]
    lines += ["", "## Gates", "", *(invalid or ["All gates passed."]), "", "## Plots", ""]
    lines += [f"![{name}]({name})" for name in plots]
    return "\n".join(lines) + "\n"


def write_report(results: dict[str, Any], out: Path, sampler: Any = None, scraper: Any = None,
                 plots: bool = True) -> dict[str, Any]:
    """Write every result file into ``out``; returns ``results`` with ``schema_version`` and ``files``.

    Arguments:
        results: spec, environment, runs, levels.
        out: the output directory.
        sampler: the NVML sampler (telemetry.csv).
        scraper: the metrics scraper (server_metrics.csv).
        plots: also draw PNG plots.
    """
    out.mkdir(parents=True, exist_ok=True)
    _write_csv(out / FILES["csv"], csv_rows(results),
               ["run_id", "scenario", "level", "repeat", "metric", "stat", "value", "unit"])
    _write_csv(out / FILES["telemetry"], sampler.rows() if sampler else [], list(TELEMETRY_COLUMNS))
    _write_csv(out / FILES["server_metrics"], scraper.rows() if scraper else [],
               ["t_mono_ns", "metric", "labels", "value"])
    pngs = []
    if plots:
        pngs = draw_all(results, out, sampler.samples if sampler else [], scraper.snapshots if scraper else [])
    results = {"schema_version": SCHEMA_VERSION, **results,
               "files": {**FILES, "plots": pngs}}
    (out / FILES["markdown"]).write_text(markdown(results, pngs))
    (out / FILES["summary"]).write_text(json.dumps(results, indent=2, default=str))
    return results


def read_summary(path: Path) -> dict[str, Any]:
    """Read a ``summary.json`` (or a directory holding one); rejects unknown major schema versions.

    Arguments:
        path: the file or its directory.
    """
    path = path / FILES["summary"] if path.is_dir() else path
    try:
        results = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise KitError(f"cannot read benchmark results {path}: {exc}; pass a summary.json written by bench.") from None
    major = str(results.get("schema_version", "0")).split(".")[0]
    if major != SCHEMA_VERSION.split(".")[0]:
        raise KitError(f"{path} has schema_version {results.get('schema_version')!r}; this trtllm-kit reads "
                       f"{SCHEMA_VERSION.split('.')[0]}.x. Re-run the benchmark with this version.")
    return results
