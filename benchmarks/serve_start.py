"""Ready and stop times of ``trtllm-kit serve`` for the tiny model, beside a bare ``tritonserver`` on the same repo.

    python benchmarks/serve_start.py [--runs 3] [--out OUT] [--json]

The kit side runs the commands a user runs: ``trtllm-kit serve OUT --detach --openai-port P`` (ready: the command
returns, every model and the OpenAI port answering) and ``trtllm-kit stop OUT`` (stop: the command returns, every
process gone). ``server_ready`` is the serve's own figure: tritonserver started to ready, inside that command. The
bare side starts tritonserver directly on the working repository the kit made (same models, same flags, explicit
loads) and polls ``/v2/health/ready`` every 10 ms; its stop is SIGTERM to the exit of its last process. One untimed
warm-up of each, then the kinds alternate; fresh free ports each time. OUT defaults to a fresh build of
``builtin:tiny-llama``. Prints the medians with units and the command line that reproduces them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trtllm_kit.serve.server.group import kit_environment  # noqa: E402
from trtllm_kit.serve.server.launcher import LaunchConfig, free_endpoints, free_port, launch_argv  # noqa: E402
from trtllm_kit.serve.server.locate import locate_tritonserver  # noqa: E402
from trtllm_kit.serve.server.reaper import group_alive  # noqa: E402
from trtllm_kit.serve.server.state import read_state, run_dir  # noqa: E402

KIT = [sys.executable, "-m", "trtllm_kit"]


LOG_TIME = re.compile(r"^[IWE]\d{4} (\d\d):(\d\d):(\d\d\.\d+) ", re.MULTILINE)
LOADED = re.compile(r"^[IWE]\d{4} (\d\d):(\d\d):(\d\d\.\d+) .*successfully loaded '([^']+)'", re.MULTILINE)


@dataclass
class Figures:
    runs: int
    kit_ready_s: float  # medians
    kit_server_ready_s: float
    kit_stop_s: float
    bare_ready_s: float
    bare_stop_s: float
    model_loaded_s: dict[str, float]  # tritonserver's first log line to "successfully loaded" (kit runs)
    samples: dict[str, list[float]]


def model_loaded_s(log: Path) -> dict[str, float]:
    """Seconds from tritonserver's first log line to each model's "successfully loaded" line."""
    text = log.read_text(errors="replace")
    first = LOG_TIME.search(text)
    if first is None:
        return {}
    start = _seconds(first.groups())
    return {m.group(4): round(_seconds(m.groups()[:3]) - start, 3) for m in LOADED.finditer(text)}


def _seconds(hms: tuple[str, ...]) -> float:
    return int(hms[0]) * 3600 + int(hms[1]) * 60 + float(hms[2])


def kit_run(out: Path) -> tuple[float, float, float]:
    """(ready, tritonserver-to-ready inside serve, stop) of one ``serve --detach`` and ``stop``, in seconds."""
    ep = free_endpoints()
    argv = [*KIT, "serve", str(out), "--detach", "--http-port", str(ep.http_port), "--grpc-port",
            str(ep.grpc_port), "--metrics-port", str(ep.metrics_port), "--openai-port", str(free_port())]
    started = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ready_s = time.perf_counter() - started
    state = read_state(out) or {}
    started = time.perf_counter()
    subprocess.run([*KIT, "stop", str(out)], check=True, stdout=subprocess.DEVNULL)
    return ready_s, float(state.get("ready_s", "nan")), time.perf_counter() - started


def bare_run(repo: Path, models: list[str]) -> tuple[float, float]:
    """(ready, stop) of tritonserver started directly on ``repo`` with ``models`` loaded, in seconds."""
    install = locate_tritonserver()
    ep = free_endpoints()
    config = LaunchConfig(repo=repo, endpoints=ep, shm_prefix=f"bench{os.getpid()}_",
                          extra_args=("--model-control-mode=explicit", *(f"--load-model={m}" for m in models)))
    started = time.perf_counter()
    proc = subprocess.Popen(launch_argv(install, config), env=kit_environment(install.environment()),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    while not _answers(f"http://{ep.url('http')}/v2/health/ready"):
        if proc.poll() is not None or time.perf_counter() - started > 300:
            raise SystemExit(f"tritonserver did not become ready (exit code {proc.poll()})")
        time.sleep(0.01)
    ready_s = time.perf_counter() - started
    started = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    while group_alive(proc.pid):  # the stubs leave after their server
        time.sleep(0.01)
    return ready_s, time.perf_counter() - started


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


def measure(out: Path, runs: int) -> Figures:
    samples: dict[str, list[float]] = {k: [] for k in ("kit_ready", "kit_server_ready", "kit_stop", "bare_ready",
                                                       "bare_stop")}
    loads: dict[str, list[float]] = {}
    for trial in range(runs + 1):
        kit = kit_run(out)
        repo = run_dir(out) / "repo"  # the working repository the serve made (left in place after stop)
        loaded = model_loaded_s(run_dir(out) / "tritonserver.log")
        bare = bare_run(repo, _loaded(repo))
        if trial:  # the first of each is the warm-up
            for key, value in zip(samples, (*kit, *bare), strict=True):
                samples[key].append(round(value, 3))
            for model, seconds in loaded.items():
                loads.setdefault(model, []).append(seconds)
    medians = {f"{key}_s": round(statistics.median(values), 3) for key, values in samples.items()}
    return Figures(runs=runs, samples=samples, model_loaded_s={m: statistics.median(v) for m, v in loads.items()},
                   **medians)


def _loaded(repo: Path) -> list[str]:
    """The models a serve loads by default: every model of the repository but an unused ensemble."""
    return sorted(p.name for p in repo.iterdir() if (p / "config.pbtxt").is_file() and p.name != "ensemble")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, help="a built artifact (default: a fresh builtin:tiny-llama build)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out
        if out is None:
            out = Path(tmp) / "tiny"
            subprocess.run([*KIT, "build", "builtin:tiny-llama", "--no-verify", "--out", str(out)], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        figures = measure(out, args.runs)
    if args.json:
        print(json.dumps(asdict(figures)))
        return
    print(f"median of {figures.runs} (idle machine assumed; load average {os.getloadavg()[0]:.1f}): "
          f"trtllm-kit serve --detach ready {figures.kit_ready_s:.2f} s (tritonserver start to ready inside it "
          f"{figures.kit_server_ready_s:.2f} s), trtllm-kit stop {figures.kit_stop_s:.2f} s; bare tritonserver "
          f"ready {figures.bare_ready_s:.2f} s, stop {figures.bare_stop_s:.2f} s")
    print("models loaded, seconds after tritonserver's first log line: " +
          ", ".join(f"{model} {seconds:.2f} s" for model, seconds in sorted(figures.model_loaded_s.items())))
    print("reproduce: python benchmarks/serve_start.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
