"""Prometheus parsing and window deltas, including the nv_trt_llm_* gauges of the TensorRT-LLM backend."""

from __future__ import annotations

import asyncio

import pytest

from trtllm_kit.profile.triton_metrics import MetricsScraper, parse_metrics, window_summary

TEXT = """# HELP nv_inference_request_success Number of successful inference requests
# TYPE nv_inference_request_success counter
nv_inference_request_success{{model="tensorrt_llm",version="1"}} {success}
nv_inference_request_success{{model="preprocessing",version="1"}} 999
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{{model="tensorrt_llm",reason="BACKEND",version="1"}} {failure}
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{{model="tensorrt_llm",version="1"}} {queue}
# TYPE nv_inference_compute_infer_duration_us counter
nv_inference_compute_infer_duration_us{{model="tensorrt_llm",version="1"}} {compute}
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{{model="tensorrt_llm",version="1"}} {pending}
# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{{model="tensorrt_llm",request_type="active",version="1"}} {active}
nv_trt_llm_request_metrics{{model="tensorrt_llm",request_type="waiting",version="1"}} {waiting}
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="max",model="tensorrt_llm",version="1"}} 100
nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="used",model="tensorrt_llm",version="1"}} {used}
# TYPE nv_trt_llm_general_metrics gauge
nv_trt_llm_general_metrics{{general_type="iteration_counter",model="tensorrt_llm",version="1"}} {iterations}
"""


def snap(t_s: float, **values: float):
    return parse_metrics(TEXT.format(**values), int(t_s * 1e9))


def test_window_summary_uses_counter_deltas_and_gauge_series():
    before = snap(0, success=10, failure=1, queue=1000, compute=5000, pending=0, active=0, waiting=0, used=0,
                  iterations=50)
    mid = snap(1, success=30, failure=1, queue=9000, compute=25000, pending=3, active=8, waiting=4, used=60,
               iterations=150)
    after = snap(2, success=50, failure=2, queue=21000, compute=45000, pending=0, active=0, waiting=0, used=20,
                 iterations=250)
    s = window_summary(before, after, [mid], model="tensorrt_llm")
    assert s["request_success"] == 40 and s["request_failure"] == 1
    assert s["queue_ms_per_request"] == pytest.approx(20000 / 40 / 1000)
    assert s["compute_infer_ms_per_request"] == pytest.approx(40000 / 40 / 1000)
    assert s["engine_steps_per_s"] == pytest.approx(100.0) and s["iteration_counter"] == [50, 250]
    assert s["pending_requests"] == {"mean": 1.0, "max": 3.0}
    assert s["trt_llm_requests"]["active"]["max"] == 8 and s["trt_llm_requests"]["waiting"]["max"] == 4
    assert s["kv_utilization"]["max"] == pytest.approx(0.6)


def test_scrape_of_a_real_server(triton_server):
    async def scrape():
        scraper = MetricsScraper(triton_server.metrics_url)
        return await scraper.scrape(), await MetricsScraper("http://127.0.0.1:9/metrics").scrape()

    snapshot, missing = asyncio.run(scrape())
    assert snapshot.total("nv_inference_request_success", model="tensorrt_llm") >= 0
    assert ("nv_inference_request_success", (("model", "tensorrt_llm"), ("version", "1"))) in snapshot.values
    assert missing is None


def test_probe_tells_triton_metrics_from_other_answers(triton_server, openai_server):
    async def probe(url: str) -> tuple[bool, str, int]:
        scraper = MetricsScraper(url)
        return await scraper.probe(), scraper.error, len(scraper.snapshots)

    assert asyncio.run(probe(triton_server.metrics_url)) == (True, "", 0)  # the probe's scrape is not kept
    ok, error, _ = asyncio.run(probe("http://127.0.0.1:9/metrics"))
    assert not ok and error.startswith("cannot scrape http://127.0.0.1:9/metrics: ClientConnectorError")
    ok, error, _ = asyncio.run(probe(f"{openai_server.url}/models"))
    assert not ok and "does not answer with Prometheus metrics" in error
    ok, error, _ = asyncio.run(probe(f"{openai_server.url}/nothing-here"))
    assert (ok, error) == (False, f"{openai_server.url}/nothing-here answers HTTP 404")


TRANSFERS = """# TYPE trtllm_kit_kv_transfer_metrics gauge
trtllm_kit_kv_transfer_metrics{{kv_transfer_type="transfers",model="tensorrt_llm",version="1"}} {transfers}
trtllm_kit_kv_transfer_metrics{{kv_transfer_type="seconds",model="tensorrt_llm",version="1"}} {seconds}
"""


def test_window_summary_reports_the_kv_transfer_per_request_of_a_disaggregated_serve():
    values = dict(failure=0, queue=0, compute=0, pending=0, active=0, waiting=0, used=0, iterations=0)
    before = parse_metrics(TEXT.format(success=0, **values) + TRANSFERS.format(transfers=4, seconds=0.5), 0)
    after = parse_metrics(TEXT.format(success=10, **values) + TRANSFERS.format(transfers=14, seconds=0.75), 10**9)
    out = window_summary(before, after, [], "tensorrt_llm")
    assert out["kv_transfers"] == 10 and out["kv_transfer_ms_per_request"] == pytest.approx(25.0)
    plain = window_summary(snap(0, success=0, **values), snap(1, success=1, **values), [], "tensorrt_llm")
    assert "kv_transfers" not in plain
