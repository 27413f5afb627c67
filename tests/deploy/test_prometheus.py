"""A real Prometheus scrapes a real tritonserver serving the kit's tiny Llama (CPU runtime, max batch 2) and its
OpenAI frontend while `trtllm-kit bench` ramps the load; the deployment's PrometheusRule passes `promtool check
rules` and is evaluated, and the autoscaler's own query, taken from the ScaledObject, rises with the load and falls
after it; the queue alert fires under the load; every series the alerts and the dashboard read is one the served
model exports. The scraped series is then replayed through the autoscaler (`deploy simulate`)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml
from deploy_helpers import IMAGE
from kit_server import BuildKey, Builds, KitServer
from polling import wait_until

from trtllm_kit.cli import run
from trtllm_kit.deploy.prometheus import LocalPrometheus, _get, duration, query, query_range
from trtllm_kit.serve.server.launcher import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow,
              pytest.mark.skipif(shutil.which("prometheus") is None or shutil.which("promtool") is None,
                                 reason="needs Debian's prometheus package (prometheus and promtool on PATH)")]
LABELS = {"namespace": "llm", "app": "tiny", "pod": "tiny-0"}  # what the PodMonitor attaches in a cluster
SCRAPE_S = 0.5  # the scrape and rule evaluation interval: the waits below are counted in it


@dataclass(frozen=True)
class Scraped:
    k8s: Path
    prometheus: LocalPrometheus
    start: float
    end: float
    query: str


def rules_file(k8s: Path, interval: str | None = None) -> dict:
    """The PrometheusRule's ``spec`` as a Prometheus rules file (optionally evaluated every ``interval``, alerts
    firing at once instead of after their ``for``)."""
    rule = yaml.safe_load((k8s / "prometheusrule.yaml").read_text())
    groups = rule["spec"]["groups"]
    if interval is not None:
        groups = [{**group, "interval": interval,
                   "rules": [{k: v for k, v in r.items() if k != "for"} for r in group["rules"]]} for group in groups]
    return {"groups": groups}


def wait_for(condition: Callable[[], bool]) -> bool:
    """Whether ``condition`` held within a minute, checked every tenth of a scrape interval."""
    return wait_until(condition, 60.0, SCRAPE_S / 10)


def post(url: str, body: dict) -> int:
    request = urllib.request.Request(f"http://{url}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.fixture(scope="module")
def scraped(kit_builds: Builds, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scraped]:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("scale")
    out = kit_builds.copy(BuildKey.of(max_batch_size=2), root / "out")  # its own: its load is what is measured
    assert run(["deploy", "k8s", str(out), "--out", str(root / "k8s"), "--pvc", "models", "--name", "tiny",
                "--namespace", "llm", "--queue-target", "1", "--image", "registry.example/trtllm-kit:0.1.0"]) == 0
    server = KitServer(out).start()
    openai = f"127.0.0.1:{server.port}"
    prometheus = LocalPrometheus(free_port(), [(server.metrics, LABELS), (openai, LABELS)],
                                 rules_file(root / "k8s", interval=duration(SCRAPE_S)), scrape_s=SCRAPE_S)
    scaled = yaml.safe_load((root / "k8s" / "scaledobject.yaml").read_text())
    autoscaler = scaled["spec"]["triggers"][0]["metadata"]["query"]
    try:
        prometheus.start()
        start = time.time()
        assert wait_for(lambda: query(prometheus.url, autoscaler) == 0)  # idle samples before the load
        code = run(["bench", "--url", f"grpc://{server.grpc}", "--concurrency", "1,6", "--duration", "3",
                    "--isl", "16", "--osl", "48", "--vocab-size", "1031", "--warmup", "0", "--no-plots",
                    "--max-client-lag", "1000", "--out", str(root / "bench")])
        assert code == 0
        with urllib.request.urlopen(f"http://{openai}/v1/models", timeout=30) as response:
            model = json.loads(response.read())["data"][0]["id"]
        for _ in range(2):  # two scrapes apart: the histograms' rate sees an increase
            assert post(openai, {"model": model, "prompt": "The capital of France is", "max_tokens": 4}) == 200
            time.sleep(2.5 * SCRAPE_S)
        assert post(openai, {"model": model, "prompt": "x", "max_tokens": -1}) == 400  # counted as an error
        # the queue drains and the cache empties, and the scrapes and the recording rule see it
        assert wait_for(lambda: query(prometheus.url, autoscaler) == 0 and query(
            prometheus.url, 'trtllm_kit:kv_cache_used:fraction{app="tiny"}') == 0)
        time.sleep(2 * SCRAPE_S)  # two more idle scrapes: the range ends on them
        yield Scraped(root / "k8s", prometheus, start, time.time(), autoscaler)
    finally:
        prometheus.stop()
        server.stop()


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
    series = query_range(scraped.prometheus.url, scraped.query, scraped.start, scraped.end, SCRAPE_S)
    assert scraped.query == 'sum(nv_trt_llm_request_metrics{namespace="llm",app="tiny",request_type="waiting"})'
    values = [v for _, v in series]
    assert len(values) >= 10
    peak = max(values)
    assert values[0] == 0 and peak >= 2  # 6 in flight, 2 in the batch: up to 4 wait
    assert values[-1] == 0 and values.index(peak) < len(values) - 2
    recorded = query_range(scraped.prometheus.url, 'sum(trtllm_kit:requests_waiting:sum{namespace="llm"})',
                           scraped.start, scraped.end, SCRAPE_S)
    assert max(v for _, v in recorded) >= 2  # the recording rule evaluates on the same series
    kv = query(scraped.prometheus.url, 'trtllm_kit:kv_cache_used:fraction{app="tiny"}')
    assert kv == 0  # nothing in the cache once the load is gone


def test_simulate_replays_the_scraped_series(scraped, tmp_path, capsys):
    code = run(["deploy", "simulate", str(scraped.k8s), "--prometheus", scraped.prometheus.url, "--start",
                str(scraped.start), "--end", str(scraped.end), "--step", str(SCRAPE_S), "--save",
                str(tmp_path / "s.json"), "--extend", "900", "--plot", str(tmp_path / "scale.png"), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    replayed = json.loads(captured.out)
    saved = json.loads((tmp_path / "s.json").read_text())
    assert max(v for _, v in saved["signal"]) >= 2 and max(v for _, v in saved["load"]) >= 5
    assert replayed["target"] == 1 and (tmp_path / "scale.png").stat().st_size > 10_000
    # the load lasted seconds: the one-minute scale-up window keeps the replicas at one (no flapping)
    assert {s["replicas"] for s in replayed["steps"]} == {1}


def metric_names(promql: str) -> set[str]:
    """The metric names a query reads (identifiers before a selector's brace)."""
    return set(re.findall(r"([A-Za-z_:][A-Za-z0-9_:]*)\{", promql)) - {"by"}


def test_the_alerts_read_exported_series_and_the_queue_alert_fires(scraped):
    from trtllm_kit.deploy.alerts import alerts
    from trtllm_kit.deploy.objects import Names
    from trtllm_kit.deploy.serving import TRITON

    exported = set(_get(scraped.prometheus.url, "/api/v1/label/__name__/values", {}))
    found = alerts(Names("tiny", "llm"), TRITON, 1.0, 2.0)
    assert [a.name for a in found] == ["TrtllmKitQueueBacklog", "TrtllmKitErrorRate", "TrtllmKitTimeToFirstToken",
                                       "TrtllmKitKVCacheFull"]
    for alert in found:
        assert metric_names(alert.signal) <= exported, alert.name
        query(scraped.prometheus.url, alert.rule()["expr"])  # Prometheus evaluates it (a bad query raises)
    ttft = query(scraped.prometheus.url, found[2].signal.replace("[5m]", "[10m]"))
    assert ttft is not None and ttft > 0  # the OpenAI request's first token
    kv = query(scraped.prometheus.url, found[3].signal)
    assert kv is not None and 0 <= kv <= 1
    fired = query_range(scraped.prometheus.url, 'count(ALERTS{alertname="TrtllmKitQueueBacklog",app="tiny",'
                        'alertstate="firing"})', scraped.start, scraped.end, SCRAPE_S)
    assert fired, "6 requests in flight and 2 in the batch: more than 2 wait, the queue alert fires"


def test_the_dashboard_reads_exported_series(scraped):
    exported = set(_get(scraped.prometheus.url, "/api/v1/label/__name__/values", {}))
    config_map = yaml.safe_load((scraped.k8s / "dashboard-configmap.yaml").read_text())
    [board] = [json.loads(text) for text in config_map["data"].values()]
    queries = [target["expr"] for panel in board["panels"] for target in panel["targets"]]
    read = set().union(*(metric_names(q) for q in queries))
    dcgm = {name for name in read if name.startswith("DCGM_FI_")}  # the DCGM exporter's, beside the pods
    assert dcgm and read - dcgm <= exported, sorted(read - dcgm - exported)


@pytest.mark.parametrize(("kwargs", "args", "num_rules"), [
    ({"tp": 2}, (), 8),  # Triton: 4 recording rules, 4 alerts
    ({"target": "llmapi", "tp": 8}, ("--gpus-per-node", "4"), 3),  # trtllm-serve leaders: the queue only
])
def test_promtool_checks_the_written_rules_and_alerts(artifact, tmp_path, kwargs, args, num_rules):
    out = tmp_path / "k8s"
    assert run(["deploy", "k8s", str(artifact(**kwargs)), "--out", str(out), "--pvc", "models", "--image",
                IMAGE, *args]) == 0
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rules_file(out)))
    done = subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and f"SUCCESS: {num_rules} rules found" in done.stdout, done.stdout + done.stderr


def test_the_endpoint_picker_reads_series_the_served_model_exports(scraped):
    from trtllm_kit.deploy.router import MODEL_SERVERS
    from trtllm_kit.deploy.serving import TRITON

    server = MODEL_SERVERS[TRITON.name]
    assert server.metrics_port == 8002 and server.metrics_path == "/metrics"  # the port the tritonserver scrape read
    for protocol, series in server.metrics().items():
        name, _, matchers = series.partition("{")
        value = query(scraped.prometheus.url, f'max({name}{{app="tiny",{matchers})')
        assert value is not None and value >= 0, protocol
    assert query(scraped.prometheus.url, 'max(nv_trt_llm_kv_cache_block_metrics{app="tiny",'
                 'kv_cache_block_type="tokens_per"})') > 0  # a block holds tokens


def test_intervals_are_written_in_milliseconds_prometheus_takes():
    from trtllm_kit.errors import KitUsageError

    assert (duration(0.5), duration(1.0), duration(15)) == ("500ms", "1000ms", "15000ms")  # "0.5s" is refused
    with pytest.raises(KitUsageError, match=r"^a Prometheus interval of 0.0001 s is under its resolution of 1 ms\.$"):
        duration(0.0001)
