"""Speculative decoding's counters under vLLM's names on Triton's /metrics of a real serve: a copy-heavy greedy
request on a ``--speculative ngram`` build raises drafts, draft tokens, accepted tokens and accepted tokens per
position (labelled ``model_name`` and ``position``); the same request on a build without speculation leaves them at
0. ``SpecDecodeCounters`` publishes only what the engine's counts gained."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kit_server import TINY_BUILDS, KitServer, Servers
from prometheus_client.parser import text_string_to_metric_families

from trtllm_kit.cli import run
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


def test_the_counters_stay_zero_without_speculation(kit_servers: Servers) -> None:
    server = kit_servers.get(TINY_BUILDS["cpu"])
    complete(server)
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
