"""A real Prometheus scrapes a real tritonserver serving the kit's tiny Llama (CPU runtime, max batch 2) while
`trtllm-kit bench` ramps the load; the deployment's PrometheusRule passes `promtool check rules` and is
evaluated, and the autoscaler's own query, taken from the ScaledObject, rises with the load and falls after it.
The scraped series is then replayed through the autoscaler (`deploy simulate`)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest
import torch
import yaml

from trtllm_kit.cli import run
from trtllm_kit.deploy.prometheus import LocalPrometheus, query, query_range
from trtllm_kit.serve.options import Endpoints
from trtllm_kit.serve.server.launcher import free_endpoints, free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow,
              pytest.mark.skipif(shutil.which("prometheus") is None or shutil.which("promtool") is None,
                                 reason="needs Debian's prometheus package (prometheus and promtool on PATH)")]
LABELS = {"namespace": "llm", "app": "tiny", "pod": "tiny-0"}  # what the PodMonitor attaches in a cluster


@dataclass(frozen=True)
class Scraped:
    k8s: Path
    prometheus: LocalPrometheus
    start: float
    end: float
    query: str


def rules_file(k8s: Path, interval: str | None = None) -> dict:
    """The PrometheusRule's ``spec`` as a Prometheus rules file (optionally evaluated every ``interval``)."""
    rule = yaml.safe_load((k8s / "prometheusrule.yaml").read_text())
    groups = rule["spec"]["groups"]
    if interval is not None:
        groups = [{**group, "interval": interval} for group in groups]
    return {"groups": groups}


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Scraped:
    from trtllm_kit.build.pipeline import run_build
    from trtllm_kit.serve.service import ServeOptions, serve_detached, stop_serving
    from trtllm_kit.spec import ServeSettings, build_spec

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("scale")
    out = root / "out"
    one_each = {"preprocessing_instances": 1, "postprocessing_instances": 1, "bls_instances": 1}
    run_build(build_spec({}, {"model": "builtin:tiny-llama", "out": out,
                              "build": {"verify": False, "max_batch_size": 2}, "repo": one_each}))
    assert run(["deploy", "k8s", str(out), "--out", str(root / "k8s"), "--pvc", "models", "--name", "tiny",
                "--namespace", "llm", "--queue-target", "1", "--image", "registry.example/trtllm-kit:0.1.0"]) == 0
    endpoints: Endpoints = free_endpoints()
    serve_detached(ServeOptions(out=out, settings=ServeSettings(**asdict(endpoints), ready_timeout_s=120)))
    prometheus = LocalPrometheus(free_port(), [(endpoints.url("metrics"), LABELS)],
                                 rules_file(root / "k8s", interval="1s"), scrape_s=1.0)
    try:
        prometheus.start()
        time.sleep(3)  # idle samples before the load
        start = time.time()
        code = run(["bench", "--url", f"grpc://{endpoints.url('grpc')}", "--concurrency", "1,6", "--duration", "6",
                    "--isl", "16", "--osl", "48", "--vocab-size", "1031", "--warmup", "0", "--no-plots",
                    "--max-client-lag", "1000", "--out", str(root / "bench")])
        assert code == 0
        end = time.time()
        time.sleep(4)  # the queue drains, the next scrapes see it
        scaled = yaml.safe_load((root / "k8s" / "scaledobject.yaml").read_text())
        yield Scraped(root / "k8s", prometheus, start - 3, end + 4, scaled["spec"]["triggers"][0]["metadata"]["query"])
    finally:
        prometheus.stop()
        stop_serving(out, 30)


def test_promtool_checks_the_prometheus_rule(tmp_path):
    from trtllm_kit.deploy.monitoring import prometheus_rule
    from trtllm_kit.deploy.objects import Names

    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": prometheus_rule(Names("tiny", "llm"), {})["spec"]["groups"]}))
    done = subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "SUCCESS: 4 rules found" in done.stdout, done.stdout + done.stderr
    rules.write_text(yaml.safe_dump({"groups": [{"name": "x", "rules": [{"record": "a", "expr": "sum(("}]}]}))
    broken = subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert broken.returncode != 0  # promtool is a real check


def test_the_autoscaler_query_rises_with_load_and_falls_after(scraped):
    series = query_range(scraped.prometheus.url, scraped.query, scraped.start, scraped.end, 1.0)
    assert scraped.query == 'sum(nv_trt_llm_request_metrics{namespace="llm",app="tiny",request_type="waiting"})'
    values = [v for _, v in series]
    assert len(values) >= 10
    peak = max(values)
    assert values[0] == 0 and peak >= 2  # 6 in flight, 2 in the batch: up to 4 wait
    assert values[-1] == 0 and values.index(peak) < len(values) - 2
    recorded = query_range(scraped.prometheus.url, 'sum(trtllm_kit:requests_waiting:sum{namespace="llm"})',
                           scraped.start, scraped.end, 1.0)
    assert max(v for _, v in recorded) >= 2  # the recording rule evaluates on the same series
    kv = query(scraped.prometheus.url, 'trtllm_kit:kv_cache_used:fraction{app="tiny"}')
    assert kv == 0  # nothing in the cache once the load is gone


def test_simulate_replays_the_scraped_series(scraped, tmp_path, capsys):
    code = run(["deploy", "simulate", str(scraped.k8s), "--prometheus", scraped.prometheus.url, "--start",
                str(scraped.start), "--end", str(scraped.end), "--step", "1", "--save", str(tmp_path / "s.json"),
                "--extend", "900", "--plot", str(tmp_path / "scale.png"), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    replayed = json.loads(captured.out)
    saved = json.loads((tmp_path / "s.json").read_text())
    assert max(v for _, v in saved["signal"]) >= 2 and max(v for _, v in saved["load"]) >= 5
    assert replayed["target"] == 1 and (tmp_path / "scale.png").stat().st_size > 10_000
    # the load lasted seconds: the one-minute scale-up window keeps the replicas at one (no flapping)
    assert {s["replicas"] for s in replayed["steps"]} == {1}
