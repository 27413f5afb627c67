"""Speculative decoding's engine counters as Triton custom metrics under vLLM's names (``vllm:spec_decode_*``,
labelled ``model_name``; accepted tokens per draft position labelled ``position`` too), so vLLM's dashboards read
the CPU model's figures from Triton's /metrics. The llmapi model adds each ``get_stats`` iteration's
``specDecodingStats`` (no per-position figures there)."""

from __future__ import annotations

from typing import Any

from trtllm_kit.runtime.draft_counts import ITERATION_KEYS, SPEC_DECODE_COUNTERS, SPEC_DECODE_PER_POSITION, DraftCounts


class SpecDecodeCounters:
    """The counter families (kept: a family must outlive its metrics), the engine's counts they publish and what
    was already published; a position's counter appears once a draft token at that position is accepted."""

    def __init__(self, pb_utils: Any, model_name: str, counts: DraftCounts | None = None) -> None:
        """
        Arguments:
            pb_utils: Triton's Python backend utilities; model_name: the ``model_name`` label;
            counts: the speculator's engine-wide counts (updated in place by the engine; None: ``add_iterations``).
        """
        self.labels, self.counts = {"model_name": model_name}, counts

        def family(name: str, description: str) -> Any:
            return pb_utils.MetricFamily(name=name, description=description, kind=pb_utils.MetricFamily.COUNTER)

        self.families: list[Any] = []
        self.totals: dict[str, Any] = {}
        for name, field in SPEC_DECODE_COUNTERS.items():
            self.families.append(family(name, f"Speculative decoding {field}"))
            self.totals[field] = self.families[-1].Metric(labels=self.labels)
        self.families.append(family(SPEC_DECODE_PER_POSITION, "Speculative decoding accepted tokens per position"))
        self.per_position: list[Any] = []
        self.published: dict[str, int] = dict.fromkeys(SPEC_DECODE_COUNTERS.values(), 0)
        self.published_per_position: list[int] = []

    def publish(self) -> None:
        """Raise each counter by what the engine's counts gained since the last call (engine thread)."""
        assert self.counts is not None, "publish reads the engine's counts"
        for field, metric in self.totals.items():
            now = getattr(self.counts, field)
            if now > self.published[field]:
                metric.increment(now - self.published[field])
                self.published[field] = now
        for position, now in enumerate(self.counts.accepted_per_position):
            if position == len(self.per_position):
                labels = {**self.labels, "position": str(position)}
                self.per_position.append(self.families[-1].Metric(labels=labels))
                self.published_per_position.append(0)
            if now > self.published_per_position[position]:
                self.per_position[position].increment(now - self.published_per_position[position])
                self.published_per_position[position] = now

    def add_iterations(self, stats: list[Any]) -> None:
        """Raise the totals by the ``specDecodingStats`` of ``get_stats`` iterations (each counted once).

        Arguments:
            stats: the iterations ``LLM.get_stats`` returned since its last call (JSON objects).
        """
        for iteration in stats:
            spec = iteration.get("specDecodingStats") if isinstance(iteration, dict) else None
            for key, field in ITERATION_KEYS.items():
                value = int((spec or {}).get(key) or 0)
                if value > 0:
                    self.totals[field].increment(value)
