"""runtime/stats: the engine's counters under Triton's gauge names and the C++ executor's JSON keys."""

from __future__ import annotations

from dataclasses import fields

from trtllm_kit.runtime.stats import GAUGES, ExecutorStats, executor_stats, gauge_values

STATS = ExecutorStats(**{f.name: i + 1 for i, f in enumerate(fields(ExecutorStats))})


def test_every_gauge_reads_a_value_the_engine_reports() -> None:
    values = gauge_values(STATS)
    for family, (_, by_label) in GAUGES.items():
        assert set(by_label.values()) <= set(values), family
    assert values["blocks_fraction"] == STATS.blocks_used / STATS.blocks_max


def test_the_executor_keys_carry_the_engine_counters() -> None:
    stats = executor_stats(STATS)
    assert (stats["iter"], stats["numActiveRequests"], stats["numQueuedRequests"]) == (
        STATS.iteration_counter, STATS.active, STATS.waiting)
    assert stats["kvCacheStats"]["freeNumBlocks"] == STATS.blocks_free
    assert stats["inflightBatchingStats"]["numPausedRequests"] == STATS.preemptions
