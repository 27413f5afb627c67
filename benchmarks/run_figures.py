"""A run's figures for the conversion benchmarks: wall time, input GB/s and peak anonymous memory (``RssAnon`` of
this process, sampled every 5 ms in a thread: the page cache that memory-mapped reads fill is not counted), and the
best or median of repeated runs."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Figures:
    """One run of one variant."""

    variant: str
    seconds: float
    input_gb: float
    peak_anon_mb: float

    @property
    def gb_per_s(self) -> float:
        return self.input_gb / self.seconds


class AnonPeak:
    """Samples RssAnon of this process in a thread; ``peak_mb`` is the maximum seen."""

    def __init__(self, interval: float = 0.005) -> None:
        self.interval, self.peak_kb, self._stop = interval, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_kb = max(self.peak_kb, _rss_anon_kb())
            time.sleep(self.interval)

    def __enter__(self) -> AnonPeak:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_kb = max(self.peak_kb, _rss_anon_kb())

    @property
    def peak_mb(self) -> float:
        return self.peak_kb / 1024


def _rss_anon_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    return 0


def pick(figures: list[Figures], statistic: str) -> Figures:
    """The fastest (``best``) or the median run, with the largest peak memory of all runs."""
    ordered = sorted(figures, key=lambda f: f.seconds)
    run = ordered[0] if statistic == "best" else ordered[len(ordered) // 2]
    return Figures(run.variant, run.seconds, run.input_gb, max(f.peak_anon_mb for f in figures))
