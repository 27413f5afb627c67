"""Every worker's metrics at the serve's ``/metrics``: the engine's figures under a plain serve's names, each worker's
samples labelled by worker, one header per family; for real on ``serve --dynamo --workers 2``, the request counters
sum to the requests sent and a killed worker's series go, its ``up`` gauge 0."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
from dynamo_installed import needs_dynamo
from kit_server import BuildKey, Builds, KitServer
from prometheus_client.parser import text_string_to_metric_families

from trtllm_kit.runtime.stats import ExecutorStats
from trtllm_kit.serve.dynamo.engine_metrics import FAILURE, SUCCESS, RequestCounts, engine_exposition
from trtllm_kit.serve.dynamo.worker_series import UP, labelled, merged

STATS = ExecutorStats(active=2, waiting=1, max=8, scheduled=2, context=1, generation_requests=1,
                      total_context_tokens=40, step_tokens=41, blocks_max=128, blocks_free=100, blocks_used=28,
                      tokens_per_block=32, blocks_reused=5, blocks_missed=7, preemptions=0, iteration_counter=9,
                      total_scheduled_requests=12, peak_scheduled=3, timestamp=1.0)
Sample = tuple[str, tuple[tuple[str, str], ...]]
SUCCESSES = f"{SUCCESS}_total"  # as prometheus_client's parser names a counter's samples


def _samples(text: str) -> dict[Sample, float]:
    """``(name, sorted labels) → value`` of every sample; a repeated family or sample fails the test."""
    found: dict[Sample, float] = {}
    names = []
    for family in text_string_to_metric_families(text):
        names.append(family.name)
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            assert key not in found, key
            found[key] = sample.value
    assert len(names) == len(set(names)), names
    return found


def _key(name: str, **labels: str) -> Sample:
    return name, tuple(sorted(labels.items()))


def _worker_total(samples: dict[Sample, float], name: str, worker: str, **labels: str) -> float:
    return sum(value for (sample, keys), value in samples.items()
               if sample == name and ("worker", worker) in keys and set(labels.items()) <= set(keys))


def test_engine_exposition_has_a_plain_serve_s_names_and_labels() -> None:
    requests = RequestCounts()
    for ended in (True, True, False):
        requests.count(ended)
    samples = _samples(engine_exposition(STATS, requests))
    slot = {"model": "tensorrt_llm", "version": "1"}
    assert samples[_key("nv_trt_llm_request_metrics", request_type="waiting", **slot)] == 1
    assert samples[_key("nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="max", **slot)] == 128
    assert samples[_key("nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="fraction", **slot)] == 28 / 128
    assert samples[_key("nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="reused", **slot)] == 5
    assert samples[_key("trtllm_kit_batch_metrics", batch_metric="step_tokens", **slot)] == 41
    text = engine_exposition(STATS, requests).splitlines()
    assert f'{SUCCESS}{{model="tensorrt_llm",version="1"}} 2.0' in text  # Triton's spelling: no _total
    assert f'{FAILURE}{{model="tensorrt_llm",version="1"}} 1.0' in text
    assert f"# TYPE {SUCCESS} counter" in text


@pytest.mark.parametrize(("line", "expected"), [
    ('a{b="1"} 2', 'a{worker="w-0",b="1"} 2'),
    ("a 2", 'a{worker="w-0"} 2'),
    ("a{} 2", 'a{worker="w-0"} 2'),
    ('a_bucket{le="+Inf",x="{ }"} 3 1700', 'a_bucket{worker="w-0",le="+Inf",x="{ }"} 3 1700'),
])
def test_a_sample_gains_the_worker_label(line: str, expected: str) -> None:
    assert labelled(line, "w-0") == expected


def test_merged_keeps_one_header_per_family_and_labels_each_worker() -> None:
    frontend = "# HELP f_total requests\n# TYPE f_total counter\nf_total 4\n"
    dynamo = ('# HELP dynamo_component_requests_total served\n# TYPE dynamo_component_requests_total counter\n'
              'dynamo_component_requests_total{dynamo_endpoint="http"} 4\n')
    workers = {name: engine_exposition(replace(STATS, waiting=i), RequestCounts(success=i + 1)) +
               'dynamo_component_requests_total{dynamo_endpoint="generate"} 1\n'
               for i, name in enumerate(("worker-0", "worker-1"))}
    text = merged([frontend, dynamo], {**workers, "worker-2": None})
    samples = _samples(text)  # parses, with no family named twice
    assert text.count(f"# TYPE {SUCCESS} counter") == 1
    assert samples[("f_total", ())] == 4
    assert samples[("dynamo_component_requests_total", (("dynamo_endpoint", "http"),))] == 4
    for i, worker in enumerate(("worker-0", "worker-1")):
        assert _worker_total(samples, "nv_trt_llm_request_metrics", worker, request_type="waiting") == i
        assert _worker_total(samples, SUCCESSES, worker) == i + 1
        assert _worker_total(samples, "dynamo_component_requests_total", worker) == 1
        assert samples[(UP, (("worker", worker),))] == 1
    assert samples[(UP, (("worker", "worker-2"),))] == 0
    assert not any(("worker", "worker-2") in keys for name, keys in samples if name != UP)


def _scrape(server: KitServer) -> dict[Sample, float]:
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=30) as response:
        return _samples(response.read().decode())


@pytest.mark.integration
@pytest.mark.slow
@needs_dynamo
def test_each_worker_s_series_are_at_the_serve_s_metrics(kit_builds: Builds, tmp_path: Path) -> None:
    out = kit_builds.copy(BuildKey.of(target="cpu"), tmp_path / "out")
    with KitServer(out, dynamo=True, workers=2, router="round-robin") as server:
        workers = sorted(server.state["workers"])
        for number in range(6):
            body = {"model": server.state["model"], "prompt": [1, 300 + number, 400, 500], "max_tokens": 2,
                    "temperature": 0}
            status, _, raw = server.post("/v1/completions", json.dumps(body).encode())
            assert status == 200, raw
        served = _scrape(server)
        os.kill(server.state["workers"]["worker-1"]["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 30
        after = _scrape(server)
        while after.get((UP, (("worker", "worker-1"),))) != 0 and time.monotonic() < deadline:
            time.sleep(0.5)
            after = _scrape(server)
    assert workers == ["worker-0", "worker-1"]
    counted = {worker: _worker_total(served, SUCCESSES, worker) for worker in workers}
    assert sum(counted.values()) == 6 and min(counted.values()) >= 1, counted  # round-robin: both served
    for worker in workers:
        assert _worker_total(served, "nv_trt_llm_kv_cache_block_metrics", worker, kv_cache_block_type="max") > 0
        assert _worker_total(served, "trtllm_kit:prefix_cache_queries_total", worker) >= 4 * counted[worker]
        assert _worker_total(served, "dynamo_component_requests_total", worker) >= counted[worker]
        assert served[(UP, (("worker", worker),))] == 1
    assert _key("trtllm_kit_openai_requests_total", endpoint="completions", model=server.state["model"],
                status="200") in served  # the kit's frontend's, unlabelled
    assert after[(UP, (("worker", "worker-1"),))] == 0
    assert not any(("worker", "worker-1") in keys for name, keys in after if name != UP)
    assert _worker_total(after, SUCCESSES, "worker-0") == counted["worker-0"]
