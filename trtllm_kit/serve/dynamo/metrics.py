"""The worker's prefix-cache metrics: the CPU runtime's block manager counters as Prometheus families.

Each kit worker appends them to Dynamo's worker ``/metrics`` (its system status server on loopback, port
``DYN_SYSTEM_PORT``), beside Dynamo's own worker metrics (``dynamo_component_*``); the worker writes that address
into its ready file (``RUN_DIR/dynamo/ready/worker-N``), an address of the serve's private network namespace, read
from inside it (``launch.serve_net``). The names are vLLM's under the kit's prefix, so a dashboard's prefix-cache panel
reads them with the prefix changed:

| family | type | value |
|---|---|---|
| ``trtllm_kit:prefix_cache_queries_total{model_name}`` | counter | tokens of the sequences looked up for reuse |
| ``trtllm_kit:prefix_cache_hits_total{model_name}`` | counter | of them, tokens found in cached blocks |
| ``trtllm_kit:kv_cache_usage_perc{model_name}`` | gauge | fraction of KV blocks held by sequences, 0 to 1 |

The hit rate is ``hits / queries`` over an interval (both counters' increase).
"""

from __future__ import annotations

import random
import socket
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from trtllm_kit.errors import KitError, KitUsageError
from trtllm_kit.serve.dynamo.launch import DynamoDirs

QUERIES = "trtllm_kit:prefix_cache_queries"
HITS = "trtllm_kit:prefix_cache_hits"
USAGE = "trtllm_kit:kv_cache_usage_perc"
SYSTEM_PORT_ENV = "DYN_SYSTEM_PORT"  # where Dynamo's runtime serves a worker's /metrics
SYSTEM_PORTS = range(10_000, 32_768)  # Dynamo 1.6 reads DYN_SYSTEM_PORT as a signed 16-bit number


class PrefixCounters(Protocol):
    """What the metrics read of the CPU runtime's ``BlockManager``."""

    num_queried_tokens: int
    num_hit_tokens: int

    @property
    def num_blocks(self) -> int: ...

    @property
    def num_used_blocks(self) -> int: ...


@dataclass(frozen=True)
class PrefixCounts:
    """A worker's prefix-cache counters at one scrape, in tokens."""

    queried_tokens: int = 0
    hit_tokens: int = 0

    def __add__(self, other: PrefixCounts) -> PrefixCounts:
        return PrefixCounts(self.queried_tokens + other.queried_tokens, self.hit_tokens + other.hit_tokens)

    def __sub__(self, earlier: PrefixCounts) -> PrefixCounts:
        return PrefixCounts(self.queried_tokens - earlier.queried_tokens, self.hit_tokens - earlier.hit_tokens)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


class PrefixCacheCollector(Collector):
    """The three families of one worker, read from its block manager at each scrape.

    Arguments:
        counters: the worker's block manager; model_name: the served name (the ``model_name`` label).
    """

    def __init__(self, counters: PrefixCounters, model_name: str) -> None:
        self.counters, self.model_name = counters, model_name

    def collect(self) -> Iterator[Metric]:
        labels = [self.model_name]
        queries = CounterMetricFamily(QUERIES, "Tokens of the sequences looked up in the prefix cache.",
                                      labels=["model_name"])
        queries.add_metric(labels, self.counters.num_queried_tokens)
        hits = CounterMetricFamily(HITS, "Tokens found in the prefix cache.", labels=["model_name"])
        hits.add_metric(labels, self.counters.num_hit_tokens)
        usage = GaugeMetricFamily(USAGE, "Fraction of KV cache blocks held by sequences (0 to 1).",
                                  labels=["model_name"])
        usage.add_metric(labels, self.counters.num_used_blocks / max(self.counters.num_blocks, 1))
        yield from (queries, hits, usage)


def exposition(counters: PrefixCounters, model_name: str) -> str:
    """The worker's families as Prometheus text (what Dynamo's metrics callback returns).

    Arguments:
        counters: the worker's block manager; model_name: the served name.
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PrefixCacheCollector(counters, model_name))
    return generate_latest(registry).decode()


def prefix_counts(text: str) -> PrefixCounts:
    """The prefix-cache counters in a worker's ``/metrics`` text (summed over its models).

    Arguments:
        text: Prometheus exposition text.
    """
    values = {QUERIES: 0.0, HITS: 0.0}
    found = set()
    for family in text_string_to_metric_families(text):
        if family.name in values:
            found.add(family.name)
            values[family.name] += sum(s.value for s in family.samples if s.name == f"{family.name}_total")
    if len(found) < len(values):
        raise KitError(f"the worker's /metrics names no {' or '.join(sorted(set(values) - found))}; is it a kit "
                       "worker of serve --dynamo?")
    return PrefixCounts(int(values[QUERIES]), int(values[HITS]))


def system_port(host: str, attempts: int = 100) -> int:
    """A port in ``SYSTEM_PORTS`` free on ``host`` right now, for Dynamo's system status server.

    Arguments:
        host: the address it will bind; attempts: ports tried before giving up.
    """
    for port in random.sample(SYSTEM_PORTS, attempts):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    raise KitError(f"none of {attempts} ports tried in {SYSTEM_PORTS.start}-{SYSTEM_PORTS.stop - 1} is free on "
                   f"{host}; free some ports and start the worker again.")


def worker_metrics_urls(root: Path) -> dict[str, str]:
    """``worker-N → its /metrics URL`` from the ready files of a running ``serve --dynamo``.

    Arguments:
        root: the serve's ``RUN_DIR/dynamo``.
    """
    urls = {f.name: f.read_text().strip() for f in sorted(DynamoDirs(root).ready.glob("worker-*"))
            if not f.suffix}  # not one being written (.part), nor the worker's instance id (.instance)
    if not urls:
        raise KitUsageError(f"{DynamoDirs(root).ready} holds no worker ready file; pass the RUN_DIR/dynamo of a "
                            "running serve --dynamo.")
    return urls


def scrape(url: str, timeout_s: float = 10.0) -> PrefixCounts:
    """A worker's prefix-cache counters now.

    Arguments:
        url: its ``/metrics`` URL; timeout_s: seconds to wait for the answer.
    """
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return prefix_counts(response.read().decode())
