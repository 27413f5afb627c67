"""The CPU model's ``nv_trt_llm_*`` gauges, without Triton: every gauge set the first time, then only those whose
values changed (each set is a message to tritonserver), by a thread of their own that sets the latest counters
handed over; handed over every ``PUBLISH_EVERY_S`` while the engine has work, at once when it has none."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import fields, replace
from types import SimpleNamespace
from typing import Any

from trtllm_kit.runtime.stats import GAUGES, ExecutorStats
from trtllm_kit.triton_models.cpu_gauges import PUBLISH_EVERY_S, CpuGauges

STATS = ExecutorStats(**{f.name: i + 1 for i, f in enumerate(fields(ExecutorStats))})


class FakeMetric:
    def __init__(self, sets: list[tuple[str, float]], labels: dict[str, str]) -> None:
        self.sets, self.labels = sets, labels

    def set(self, value: float) -> None:
        self.sets.append((next(v for k, v in self.labels.items() if k not in ("model", "version")), value))


def fake_backend(sets: list[tuple[str, float]]) -> Any:
    class MetricFamily:
        GAUGE = "gauge"

        def __init__(self, name: str, description: str, kind: str) -> None:
            self.name = name

        def Metric(self, labels: dict[str, str]) -> FakeMetric:
            return FakeMetric(sets, labels)
    return SimpleNamespace(MetricFamily=MetricFamily)


def test_the_first_turn_sets_every_gauge_and_later_turns_those_that_changed() -> None:
    sets: list[tuple[str, float]] = []
    gauges = CpuGauges(fake_backend(sets), {"model": "tensorrt_llm", "version": "1"})
    gauges.close()
    gauges.set_changed(STATS)
    assert len(sets) == sum(len(by_value) for _, by_value in GAUGES.values())
    sets.clear()
    gauges.set_changed(STATS)
    assert sets == []
    gauges.set_changed(replace(STATS, iteration_counter=100, blocks_used=50))
    assert sorted(sets) == sorted([("iteration_counter", 100.0), ("used", 50.0),
                                   ("fraction", 50 / STATS.blocks_max)])


def test_a_working_engine_publishes_once_a_period_and_an_idle_one_at_once() -> None:
    gauges = CpuGauges(fake_backend([]), {"model": "tensorrt_llm", "version": "1"})
    gauges.close()
    assert gauges.is_due(5.0, has_work=True)  # never published
    gauges.publish(STATS, 5.0)
    assert not gauges.is_due(5.0 + PUBLISH_EVERY_S / 2, has_work=True)
    assert gauges.is_due(5.0 + PUBLISH_EVERY_S / 2, has_work=False)  # the values it rests at
    assert gauges.is_due(5.0 + PUBLISH_EVERY_S * 1.5, has_work=True)


def test_the_thread_sets_the_counters_handed_over_last_before_it_closes() -> None:
    sets: list[tuple[str, float]] = []
    gauges = CpuGauges(fake_backend(sets), {"model": "tensorrt_llm", "version": "1"})
    for step in range(1, 50):
        gauges.publish(replace(STATS, iteration_counter=step), float(step))
    gauges.close()
    assert not gauges._thread.is_alive()
    assert [value for name, value in sets if name == "iteration_counter"][-1] == 49.0
    assert gauges.published["iteration_counter"] == 49.0


def test_the_thread_sleeps_without_handovers_and_the_next_one_wakes_it() -> None:
    sets: list[tuple[str, float]] = []
    gauges = CpuGauges(fake_backend(sets), {"model": "tensorrt_llm", "version": "1"})

    def wait_for(condition: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 30  # a hang guard only
        while not condition():
            assert time.monotonic() < deadline
            time.sleep(PUBLISH_EVERY_S / 4)
    try:
        gauges.publish(STATS, 0.0)
        wait_for(lambda: gauges._is_asleep)  # the counters set, then none for a period
        assert ("iteration_counter", float(STATS.iteration_counter)) in sets
        gauges.publish(replace(STATS, iteration_counter=500), 1.0)
        wait_for(lambda: ("iteration_counter", 500.0) in sets)
    finally:
        gauges.close()
    assert not gauges._thread.is_alive()
