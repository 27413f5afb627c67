"""The CPU runtime's counters as Triton's ``nv_trt_llm_*`` gauges (``runtime/stats.py``: ``GAUGES``), labelled
with the model's name and version. Each set is a message to tritonserver that the engine thread waits for, so
the engine loop publishes every ``PUBLISH_EVERY_S`` while the engine has work and at once when it has none (the
values it rests at), and sets only the gauges whose values changed. The period is short beside a scrape's, and a
reading of the iteration counter is at most a few steps old (``tests/reliability/test_serve_cancel.py`` counts the
steps a cancelled request runs on by it)."""

from __future__ import annotations

from typing import Any

from trtllm_kit.runtime.stats import GAUGES, ExecutorStats, gauge_values

PUBLISH_EVERY_S = 0.02


class CpuGauges:
    """The gauge families (kept: a family must outlive its metrics), a metric per ``ExecutorStats`` field, and the
    value each was last set to.

    Arguments:
        pb_utils: Triton's Python backend utilities; labels: the ``model`` and ``version`` labels.
    """

    def __init__(self, pb_utils: Any, labels: dict[str, str]) -> None:
        self.families: list[Any] = []
        self.gauges: dict[str, Any] = {}
        for family, (label, by_value) in GAUGES.items():
            self.families.append(pb_utils.MetricFamily(name=family, description=f"CPU runtime {label}",
                                                       kind=pb_utils.MetricFamily.GAUGE))
            self.gauges.update({field: self.families[-1].Metric(labels={**labels, label: value})
                                for value, field in by_value.items()})
        self.published: dict[str, float] = {}  # field → the value its gauge was last set to
        self.published_s = float("-inf")  # when they were last published (monotonic seconds)

    def is_due(self, now_s: float, has_work: bool) -> bool:
        """Whether to publish now: ``PUBLISH_EVERY_S`` after the last time, or at once when the engine has no work.

        Arguments:
            now_s: monotonic seconds now; has_work: whether the engine has requests to step.
        """
        return not has_work or now_s - self.published_s >= PUBLISH_EVERY_S

    def publish(self, stats: ExecutorStats, now_s: float) -> None:
        """Set each gauge whose value differs from the one it was last set to (engine thread).

        Arguments:
            stats: the engine's counters now; now_s: monotonic seconds now.
        """
        self.published_s = now_s
        for field, value in gauge_values(stats).items():
            if field in self.gauges and self.published.get(field) != value:
                self.gauges[field].set(value)
                self.published[field] = value
