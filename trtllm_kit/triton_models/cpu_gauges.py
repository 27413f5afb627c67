"""The CPU runtime's counters as Triton's ``nv_trt_llm_*`` gauges (``runtime/stats.py``: ``GAUGES``), labelled
with the model's name and version. Each set is a message to tritonserver that its sender waits for (the longer the
rarer, as tritonserver's thread wakes for it), so the engine loop only hands the counters over, every
``PUBLISH_EVERY_S`` while the engine has work and at once when it has none (the values it rests at), and a thread
of their own sets the gauges whose values changed from the latest counters, every ``PUBLISH_EVERY_S`` while it is
handed new ones (waking it from the engine's thread each time would hand it the interpreter's lock at once, and the
engine would wait for it back), and sleeps until the next handover when it was handed none for ``SLEEP_AFTER_S``
(longer than a step of a large model on a loaded machine, so that a working engine does not wake it). The
period is short beside a scrape's, and a reading of the iteration counter is at most a few steps old
(``tests/reliability/test_serve_cancel.py`` counts the steps a cancelled request runs on by it)."""

from __future__ import annotations

import threading
from typing import Any

from trtllm_kit.runtime.stats import GAUGES, ExecutorStats, gauge_values

PUBLISH_EVERY_S = 0.02
SLEEP_AFTER_S = 1.0


class CpuGauges:
    """The gauge families (kept: a family must outlive its metrics), a metric per ``ExecutorStats`` field, the value
    each was last set to, and the thread that sets them.

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
        self.published_s = float("-inf")  # when the counters were last handed over (monotonic seconds)
        self._latest: ExecutorStats | None = None  # the counters handed over last
        self._closing = threading.Event()
        self._wake = threading.Event()  # set by a handover that finds the thread asleep
        self._is_asleep = False
        self._thread = threading.Thread(target=self._run, name="trtllm-kit-gauges", daemon=True)
        self._thread.start()

    def is_due(self, now_s: float, has_work: bool) -> bool:
        """Whether to publish now: ``PUBLISH_EVERY_S`` after the last time, or at once when the engine has no work.

        Arguments:
            now_s: monotonic seconds now; has_work: whether the engine has requests to step.
        """
        return not has_work or now_s - self.published_s >= PUBLISH_EVERY_S

    def publish(self, stats: ExecutorStats, now_s: float) -> None:
        """Hand the gauges' thread the engine's counters (engine thread; it neither waits for the sets nor wakes
        the thread).

        Arguments:
            stats: the engine's counters now; now_s: monotonic seconds now.
        """
        self.published_s = now_s
        self._latest = stats
        if self._is_asleep:
            self._is_asleep = False
            self._wake.set()

    def close(self, timeout_s: float = 5.0) -> None:
        """Set what was handed over last, then end the thread.

        Arguments:
            timeout_s: how long to wait for the thread.
        """
        self._closing.set()
        self._wake.set()
        self._thread.join(timeout=timeout_s)

    def set_changed(self, stats: ExecutorStats) -> None:
        """Set each gauge whose value differs from the one it was last set to (the gauges' thread).

        Arguments:
            stats: the engine's counters.
        """
        for field, value in gauge_values(stats).items():
            if field in self.gauges and self.published.get(field) != value:
                self.gauges[field].set(value)
                self.published[field] = value

    def _run(self) -> None:
        done: ExecutorStats | None = None
        num_idle = 0  # periods without a handover
        while True:
            stats = self._latest
            if stats is not done and stats is not None:
                self.set_changed(stats)
                done, num_idle = stats, 0
            elif num_idle * PUBLISH_EVERY_S >= SLEEP_AFTER_S:  # sleep until the next handover, then take it at once
                self._wake.clear()
                self._is_asleep = True
                if self._latest is done and not self._closing.is_set():  # not one handed over before it slept
                    self._wake.wait()
                self._is_asleep, num_idle = False, 0
                continue
            else:
                num_idle += 1
            if self._closing.wait(PUBLISH_EVERY_S):  # what was handed over before ``close``, then the end
                stats = self._latest
                if stats is not done and stats is not None:
                    self.set_changed(stats)
                return
