"""The README's scale-out plot: a real Prometheus scrapes a real tritonserver under a load ramp, and the
deployment's autoscaler is replayed on what it scraped.

    python benchmarks/scale_out.py [--levels 2,6,10,4] [--duration 60] [--queue-target 2] [--out docs]

Builds ``builtin:tiny-llama`` for the CPU runtime with a batch of 2 (so requests beyond 2 wait), serves it on
127.0.0.1, writes its Kubernetes objects with ``trtllm-kit deploy k8s`` (KEDA, the given queue target), starts
Debian's ``prometheus`` with the deployment's PrometheusRule, scraping the server every second with the labels a
PodMonitor would attach, and runs ``trtllm-kit bench --concurrency LEVELS --duration S``. Then it runs

    trtllm-kit deploy simulate K8S --prometheus URL --start T0 --end T1 --step 5 --extend 1500 \\
        --save OUT/scale-out-series.json --plot OUT/scale-out.png

and prints the replay's summary line. Needs ``prometheus`` on PATH.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch

from trtllm_kit.build.pipeline import run_build
from trtllm_kit.cli import run
from trtllm_kit.deploy.prometheus import LocalPrometheus
from trtllm_kit.serve.server.launcher import free_endpoints, free_port
from trtllm_kit.serve.service import ServeOptions, serve_detached, stop_serving
from trtllm_kit.spec import ServeSettings, build_spec

LABELS = {"namespace": "llm", "app": "tiny", "pod": "tiny-0"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="2,6,10,4", help="Concurrency levels of the ramp, in order.")
    parser.add_argument("--duration", type=float, default=60.0, help="Seconds per level.")
    parser.add_argument("--queue-target", type=float, default=2.0, help="Waiting requests per replica.")
    parser.add_argument("--out", type=Path, default=Path("docs"), help="Where the PNG and the series go.")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="scale-out.") as tmp:
        root = Path(tmp)
        out = root / "out"
        one_each = {"preprocessing_instances": 1, "postprocessing_instances": 1, "bls_instances": 1}
        run_build(build_spec({}, {"model": "builtin:tiny-llama", "out": out,
                                  "build": {"verify": False, "max_batch_size": 2}, "repo": one_each}))
        k8s = root / "k8s"
        assert run(["deploy", "k8s", str(out), "--out", str(k8s), "--pvc", "models", "--name", "tiny",
                    "--namespace", "llm", "--queue-target", f"{args.queue_target:g}"]) == 0
        import yaml

        groups = yaml.safe_load((k8s / "prometheusrule.yaml").read_text())["spec"]["groups"]
        endpoints = free_endpoints()
        serve_detached(ServeOptions(out=out, settings=ServeSettings(**asdict(endpoints), ready_timeout_s=120)))
        prometheus = LocalPrometheus(free_port(), [(endpoints.url("metrics"), LABELS)], {"groups": groups}, 1.0)
        try:
            prometheus.start()
            time.sleep(30)
            start = time.time() - 30
            code = run(["bench", "--url", f"grpc://{endpoints.url('grpc')}", "--concurrency", args.levels,
                        "--duration", f"{args.duration:g}", "--isl", "16", "--osl", "64", "--vocab-size", "1031",
                        "--warmup", "0", "--no-plots", "--max-client-lag", "1000", "--out", str(root / "bench")])
            if code:
                return code
            time.sleep(60)
            args.out.mkdir(parents=True, exist_ok=True)
            return run(["deploy", "simulate", str(k8s), "--prometheus", prometheus.url, "--start", str(start),
                        "--end", str(time.time()), "--step", "5", "--extend", "1500",
                        "--save", str(args.out / "scale-out-series.json"), "--plot", str(args.out / "scale-out.png")])
        finally:
            prometheus.stop()
            stop_serving(out, 30)


if __name__ == "__main__":
    raise SystemExit(main())
