"""Launch-to-ready time of ``trtllm-kit serve`` against a bare ``tritonserver`` with the same flags.

    python benchmarks/serve_start.py [--runs 5] [--json]

One run, one repository: a build output whose ``repo/`` holds one trivial Python-backend ``ensemble`` (complete
config, so ``--disable-auto-complete-config`` applies). Each trial starts the process, polls
``GET /v2/health/ready`` every 10 ms from outside until it answers 200, and stops it again. The two kinds of
trial alternate (kit, bare, kit, …) after one untimed warm-up of each, on fresh free ports each time.
Prints the median of each and the kit's overhead (median kit − median bare).
"""

from __future__ import annotations

import argparse
import json
import os
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

from google.protobuf import text_format  # noqa: E402
from tritonclient.grpc import model_config_pb2 as mc  # noqa: E402

from trtllm_kit.serve.launcher import LaunchConfig, free_endpoints, launch_argv  # noqa: E402
from trtllm_kit.serve.locate import locate_tritonserver  # noqa: E402

MODEL_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("text_output", np.array([[b"ok"]], np.object_))])
                for _ in requests]
"""


@dataclass
class Figures:
    runs: int
    kit_median_s: float
    bare_median_s: float
    overhead_s: float
    kit_s: list[float]
    bare_s: list[float]


def make_out(out: Path) -> Path:
    config = mc.ModelConfig(name="ensemble", backend="python", max_batch_size=8)
    config.input.add(name="text_input", data_type=mc.TYPE_STRING, dims=[1])
    config.input.add(name="max_tokens", data_type=mc.TYPE_INT32, dims=[1])
    config.output.add(name="text_output", data_type=mc.TYPE_STRING, dims=[-1])
    config.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    (out / "repo" / "ensemble" / "1").mkdir(parents=True)
    (out / "repo" / "ensemble" / "1" / "model.py").write_text(MODEL_PY)
    (out / "repo" / "ensemble" / "config.pbtxt").write_text(text_format.MessageToString(config))
    (out / "manifest.json").write_text(json.dumps({"schema_version": 1, "summary": {}}))
    return out


def time_to_ready(argv: list[str], env: dict[str, str], http: str, timeout_s: float = 60.0) -> float:
    """Seconds from Popen to ``/v2/health/ready`` == 200; the process group is stopped afterwards."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        while True:
            try:
                with urllib.request.urlopen(f"http://{http}/v2/health/ready", timeout=1) as response:
                    if response.status == 200:
                        return time.perf_counter() - started
            except OSError:
                pass
            if proc.poll() is not None or time.perf_counter() - started > timeout_s:
                raise SystemExit(f"{argv[0]} did not become ready (exit code {proc.poll()})")
            time.sleep(0.01)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
        time.sleep(1.5)  # the stubs leave within ~1.5 s of their server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    install = locate_tritonserver()
    kit_times: list[float] = []
    bare_times: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        out = make_out(Path(tmp) / "out")
        for trial in range(args.runs + 1):
            ep = free_endpoints()
            kit = [sys.executable, "-c", "from trtllm_kit.cli import main; main()", "serve", str(out),
                   "--http-port", str(ep.http_port), "--grpc-port", str(ep.grpc_port),
                   "--metrics-port", str(ep.metrics_port)]
            kit_s = time_to_ready(kit, dict(os.environ), ep.url("http"))
            ep = free_endpoints()
            config = LaunchConfig(repo=(out / "repo").absolute(), endpoints=ep, shm_prefix=f"bench{os.getpid()}_")
            bare_s = time_to_ready(launch_argv(install, config), install.environment(), ep.url("http"))
            if trial:  # the first of each is the warm-up
                kit_times.append(kit_s)
                bare_times.append(bare_s)
    kit_median, bare_median = statistics.median(kit_times), statistics.median(bare_times)
    figures = Figures(args.runs, round(kit_median, 3), round(bare_median, 3), round(kit_median - bare_median, 3),
                      [round(t, 3) for t in kit_times], [round(t, 3) for t in bare_times])
    if args.json:
        print(json.dumps(asdict(figures)))
    else:
        print(f"launch to ready, median of {args.runs}: trtllm-kit serve {kit_median:.2f} s, bare tritonserver "
              f"{bare_median:.2f} s, kit overhead {kit_median - bare_median:.2f} s")


if __name__ == "__main__":
    main()
