"""Load modes against a real tritonserver and an OpenAI SSE endpoint on 127.0.0.1 whose token pace is known:
the first token 20 ms after arrival, then one every 20 ms.

The stand-ins never send a token before its time, so the measured times have causal lower bounds that hold on
any machine; how close the harness gets to them on an idle core is a benchmark (``benchmarks/loadgen.py``), not a
test. Upper bounds are hang guards only."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from servers import FIRST_TOKEN_MS, TOKEN_MS

from trtllm_kit.profile.clients import TritonStreamClient
from trtllm_kit.profile.loadgen import closed_loop, offline, open_loop, poisson_schedule
from trtllm_kit.profile.metrics import summarize
from trtllm_kit.profile.openai_client import OpenAIStreamClient
from trtllm_kit.profile.records import RequestRecord
from trtllm_kit.profile.triton_metrics import MetricsScraper
from trtllm_kit.profile.workload import WorkloadSpec, synthetic_prompts

HANG_MS = 60_000.0


def assert_paced(summary: dict, osl: int) -> None:
    """No request saw its first token before the stand-in's first-token delay, or its last before the pace allows;
    the inter-token gaps were all measured."""
    assert summary["ttft_ms"]["min"] >= FIRST_TOKEN_MS and summary["ttft_ms"]["max"] < HANG_MS
    assert summary["e2e_ms"]["min"] >= FIRST_TOKEN_MS + (osl - 1) * TOKEN_MS and summary["e2e_ms"]["max"] < HANG_MS
    assert summary["itl_ms"]["min"] >= 0 and summary["itl_ms"]["max"] < HANG_MS


def test_poisson_schedule_is_seeded_sorted_and_exact_in_rate():
    offsets = poisson_schedule(50.0, 1000, seed=3)
    assert offsets == sorted(offsets) and offsets == poisson_schedule(50.0, 1000, seed=3)
    assert offsets[0] >= 0 and offsets[-1] <= 20e9
    gaps = np.diff(offsets) / 1e9
    assert abs(gaps.mean() - 0.02) < 0.001 and abs(gaps.std() / gaps.mean() - 1) < 0.1  # exponential: CV ≈ 1


def test_triton_closed_open_and_offline(triton_server):
    prompts = synthetic_prompts(WorkloadSpec(isl=24, osl=8), 64)

    async def main():
        client = TritonStreamClient(triton_server.grpc_url)
        scraper = MetricsScraper(triton_server.metrics_url)
        before = await scraper.scrape()
        closed = await closed_loop(client, prompts[:24], concurrency=4)
        await asyncio.sleep(0.25)  # the server's metrics refresh every 100 ms
        after = await scraper.scrape()
        opened = await open_loop(client, prompts[24:56], rate=40.0, seed=1)
        burst = await offline(client, prompts[56:])
        await client.close()
        return closed, opened, burst, before, after

    closed, opened, burst, before, after = asyncio.run(main())
    s = summarize(closed.records)
    assert s["num_ok"] == 24 and s["max_in_flight"] == 4 and s["length_mismatches"] == 0
    assert all(r.osl_observed == 8 == r.osl_server for r in closed.records)
    assert all(set(r.server) >= {"arrival_ns", "first_token_ns", "last_token_ns"} for r in closed.records)
    served = after.total("nv_inference_request_success", model="tensorrt_llm") - before.total(
        "nv_inference_request_success", model="tensorrt_llm")
    assert served == 24
    assert s["itl_ms"]["count"] == 24 * 7
    assert_paced(s, osl=8)
    o = summarize(opened.records, window_ns=opened.window_ns, offered_span_ns=opened.offered_span_ns)
    assert o["num_ok"] == 32 and o["offered_rate_per_s"] == 40.0
    assert 0 < o["send_rate_per_s"] <= 40.0 + 1e-9  # the pacer never sends ahead of its schedule
    assert o["schedule_lag_ms"]["min"] >= 0 and o["schedule_lag_ms"]["max"] < HANG_MS
    b = summarize(burst.records)
    assert b["num_ok"] == 8 and b["max_in_flight"] == 8


def test_openai_endpoint_concurrency_and_lengths(openai_server):
    prompts = synthetic_prompts(WorkloadSpec(isl=16, osl=8), 24)

    async def main():
        client = OpenAIStreamClient(openai_server.url, "standin")
        closed = await closed_loop(client, prompts[:12], concurrency=3)
        opened = await open_loop(client, prompts[12:], rate=30.0, seed=2)
        await client.close()
        return closed, opened

    closed, opened = asyncio.run(main())
    s = summarize(closed.records)
    assert s["num_ok"] == 12 and s["max_in_flight"] == 3
    assert s["length_mismatches"] == 0 and s["server_count_mismatches"] == 0
    assert all(r.osl_server == 8 for r in closed.records)
    assert_paced(s, osl=8)
    o = summarize(opened.records, window_ns=opened.window_ns, offered_span_ns=opened.offered_span_ns)
    assert o["num_ok"] == 12 and 0 < o["send_rate_per_s"] <= 30.0 + 1e-9


def test_errors_are_recorded_by_category(triton_server):
    async def main():
        wrong_model = TritonStreamClient(triton_server.grpc_url, model="no_such_model")
        nobody = TritonStreamClient("grpc://127.0.0.1:9", timeout_s=2)
        a = await closed_loop(wrong_model, synthetic_prompts(WorkloadSpec(isl=4, osl=2), 2), 1)
        b = await closed_loop(nobody, synthetic_prompts(WorkloadSpec(isl=4, osl=2), 1), 1)
        await wrong_model.close()
        await nobody.close()
        return a, b

    a, b = asyncio.run(main())
    assert summarize(a.records)["errors_by_kind"] == {"server": 2}
    assert "no_such_model" in a.records[0].error
    assert summarize(b.records)["errors_by_kind"] == {"transport": 1}


@pytest.mark.parametrize(("events", "counts"), [
    # token ids: their number, whatever the text
    ([{"choices": [{"text": "", "token_ids": [7]}]}, {"choices": [{"text": "ab", "token_ids": [8, 9]}]}], [1, 2]),
    # usage in every chunk: its growth (a chunk that held back a token carries two)
    ([{"choices": [{"text": "a"}], "usage": {"completion_tokens": 1, "prompt_tokens": 4}},
      {"choices": [{"text": "bc"}], "usage": {"completion_tokens": 3, "prompt_tokens": 4}},
      {"choices": [{"text": "", "finish_reason": "length"}], "usage": {"completion_tokens": 3, "prompt_tokens": 4}}],
     [1, 2, 0]),
    # text only: one per non-empty chunk, and the final usage is the server's count
    ([{"choices": [{"text": "a"}]}, {"choices": [{"text": ""}]}, {"choices": [{"text": "b"}]},
      {"choices": [], "usage": {"completion_tokens": 3, "prompt_tokens": 4}}], [1, 0, 1]),
])
def test_openai_chunk_token_counts(events, counts):
    record = RequestRecord("r", 4, 3)
    for t, event in enumerate(events):
        OpenAIStreamClient._read(event, record, t)
    assert [n for _, n in record.chunks] == counts
    assert record.osl_server == (3 if any("usage" in e for e in events) else None)
