"""Speculative decoding's counters under vLLM's names on Triton's /metrics of a real serve: a copy-heavy greedy
request on a ``--speculative ngram`` build raises drafts, draft tokens, accepted tokens and accepted tokens per
position (labelled ``model_name`` and ``position``); the same request on a build without speculation leaves them at
0. ``SpecDecodeCounters`` publishes only what the engine's counts gained. The CPU ``LLM`` reports each step's drafts as
the executor's ``specDecodingStats``, which the llmapi model adds to the same counters."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kit_server import TINY_BUILDS, KitServer, Servers
from prometheus_client.parser import text_string_to_metric_families

from trtllm_kit.cli import run
from trtllm_kit.llmapi.cpu_llm import LLM, SamplingParams
from trtllm_kit.llmapi.unified import write_unified
from trtllm_kit.models.inspect import inspect_model
from trtllm_kit.runtime.draft_counts import SPEC_DECODE_COUNTERS, SPEC_DECODE_PER_POSITION, DraftCounts
from trtllm_kit.triton_models.spec_decode_counters import SpecDecodeCounters

pytestmark = pytest.mark.integration
PROMPT = [1, 50, 60]  # the tiny model's greedy answer repeats its own n-grams: prompt lookup drafts some it keeps


@pytest.fixture(scope="module")
def ngram_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KitServer]:
    out = tmp_path_factory.mktemp("ngram") / "out"
    assert run(["build", "builtin:tiny-llama", "--target", "cpu", "--speculative", "ngram", "--max-draft-len", "3",
                "--no-verify", "--out", str(out)]) == 0
    with KitServer(out) as server:
        yield server


def spec_counters(server: KitServer) -> dict[str, float]:
    """Each ``vllm:spec_decode_*`` sample on Triton's /metrics, by name (and ``/position`` for the per-position one),
    with the model_name label checked."""
    with urllib.request.urlopen(f"http://{server.metrics}/metrics", timeout=10) as response:
        text = response.read().decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("vllm:spec_decode_"):
                assert sample.labels["model_name"] == "tensorrt_llm"
                position = sample.labels.get("position")
                found[sample.name.removesuffix("_total") + ("" if position is None else f"/{position}")] = sample.value
    return found


def complete(server: KitServer) -> Any:
    return server.client().completions.create(model="builtin:tiny-llama", prompt=PROMPT, max_tokens=40,
                                              temperature=0.0)


def test_the_counters_rise_on_a_speculating_serve(ngram_server: KitServer) -> None:
    before = spec_counters(ngram_server)
    complete(ngram_server)
    after = spec_counters(ngram_server)
    gained = {name: after[name] - before.get(name, 0.0) for name in after}
    drafts, draft_tokens, accepted = (gained[name] for name in SPEC_DECODE_COUNTERS)
    assert drafts >= 1 and draft_tokens >= drafts and 1 <= accepted <= draft_tokens
    per_position = [gained.get(f"{SPEC_DECODE_PER_POSITION}/{position}", 0.0) for position in range(3)]
    assert sum(per_position) == accepted and per_position == sorted(per_position, reverse=True)


def test_the_usage_names_the_requests_drafts_whole_and_streamed(ngram_server: KitServer) -> None:
    """The openai client reads ``usage.speculative`` as the served model's counts of that request; a request on a
    build without speculation has none (``test_the_counters_stay_zero_without_speculation``)."""
    whole = complete(ngram_server).usage.model_extra["speculative"]
    assert whole["drafts"] >= 1 and whole["draft_tokens"] >= whole["drafts"]
    assert 1 <= whole["accepted_tokens"] <= whole["draft_tokens"]
    assert whole["acceptance_length"] == pytest.approx(1 + whole["accepted_tokens"] / whole["drafts"])
    chunks = list(ngram_server.client().completions.create(
        model="builtin:tiny-llama", prompt=PROMPT, max_tokens=40, temperature=0.0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[-1].usage.model_extra["speculative"] == whole  # greedy: the same drafts as the whole answer


def test_the_counters_stay_zero_without_speculation(kit_servers: Servers) -> None:
    server = kit_servers.get(TINY_BUILDS["cpu"])
    assert "speculative" not in (complete(server).usage.model_extra or {})
    assert all(value == 0 for value in spec_counters(server).values())


class FakeMetric:
    def __init__(self, labels: dict[str, str], published: list[tuple[dict[str, str], float]]) -> None:
        self.labels, self.published = labels, published

    def increment(self, value: float) -> None:
        self.published.append((self.labels, value))


class FakeUtils:
    """pb_utils' MetricFamily as SpecDecodeCounters uses it, recording each increment."""

    def __init__(self) -> None:
        self.published: list[tuple[dict[str, str], float]] = []
        utils = self

        class MetricFamily:
            COUNTER = "counter"

            def __init__(self, name: str, description: str, kind: str) -> None:
                assert kind == "counter"
                self.name = name

            def Metric(self, labels: dict[str, str]) -> FakeMetric:
                return FakeMetric({**labels, "name": self.name}, utils.published)

        self.MetricFamily = MetricFamily


def test_publish_increments_by_what_the_counts_gained() -> None:
    utils, counts = FakeUtils(), DraftCounts()
    counters = SpecDecodeCounters(utils, "m", counts)
    counters.publish()
    assert utils.published == []
    counts.record(3, 2)
    counters.publish()
    counts.record(3, 0)
    counters.publish()
    by_name: dict[str, float] = {}
    for labels, value in utils.published:
        key = labels["name"] + labels.get("position", "")
        by_name[key] = by_name.get(key, 0) + value
    assert by_name == {"vllm:spec_decode_num_drafts": 2, "vllm:spec_decode_num_draft_tokens": 6,
                       "vllm:spec_decode_num_accepted_tokens": 2, f"{SPEC_DECODE_PER_POSITION}0": 1,
                       f"{SPEC_DECODE_PER_POSITION}1": 1}


def test_the_llmapi_counters_add_each_iterations_spec_decoding_stats() -> None:
    utils = FakeUtils()
    counters = SpecDecodeCounters(utils, "m")
    iteration = {"specDecodingStats": {"numRequestsWithDraftTokens": 2, "numDraftTokens": 6, "numAcceptedTokens": 3}}
    counters.add_iterations([iteration, {"iter": 3}, iteration])
    by_name: dict[str, float] = {}
    for labels, value in utils.published:
        by_name[labels["name"]] = by_name.get(labels["name"], 0) + value
    assert by_name == {"vllm:spec_decode_num_drafts": 4, "vllm:spec_decode_num_draft_tokens": 12,
                       "vllm:spec_decode_num_accepted_tokens": 6}


def test_the_cpu_llm_reports_each_steps_drafts(tmp_path: Path) -> None:
    ckpt = tmp_path
    write_unified(inspect_model("builtin:tiny-llama"), ckpt, "float32")
    llm = LLM(model=str(ckpt), max_seq_len=256, speculative_config={"decoding_type": "NGram", "max_draft_len": 3})

    async def go() -> None:
        await llm.generate_async(PROMPT, SamplingParams(max_tokens=40, temperature=0.0)).aresult()
    try:
        asyncio.run(asyncio.wait_for(go(), 120))
        stats = llm.get_stats()
        counts = llm.engine.speculator.counts  # type: ignore[union-attr]
    finally:
        llm.shutdown()
    spec = [entry["specDecodingStats"] for entry in stats]
    assert counts.num_drafts >= 1
    assert sum(s["numRequestsWithDraftTokens"] for s in spec) == counts.num_drafts
    assert sum(s["numDraftTokens"] for s in spec) == counts.num_draft_tokens
    assert sum(s["numAcceptedTokens"] for s in spec) == counts.num_accepted_tokens
    drafted = [s for s in spec if s["numRequestsWithDraftTokens"]]
    assert all(s["acceptanceLength"] == 1 + s["numAcceptedTokens"] / s["numRequestsWithDraftTokens"] for s in drafted)
