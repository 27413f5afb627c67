"""``trtllm-kit bench compare BASE NEW``: per level, the headline metrics' relative change and whether it
is a regression beyond the allowed threshold (throughput down, latency up). For CI gating."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtllm_kit.errors import KitUsageError
from trtllm_kit.profile.report import read_summary

HIGHER_IS_BETTER = {"output_tok_per_s": True, "request_per_s": True, "ttft_ms_p50": False, "itl_ms_p50": False,
                    "tpot_ms_p50": False, "e2e_ms_p50": False, "speculative_acceptance_length": True}


@dataclass(frozen=True)
class Delta:
    """One metric at one level: base and new means, relative change, and the verdict."""

    level: str
    metric: str
    base: float
    new: float
    change: float  # (new - base) / base
    threshold: float
    regressed: bool


@dataclass(frozen=True)
class Comparison:
    """All deltas, notes, and whether the new results failed their own sanity gates."""

    deltas: list[Delta]
    notes: list[str]
    new_invalid: bool

    @property
    def failed(self) -> bool:
        return self.new_invalid or any(d.regressed for d in self.deltas)


def parse_fraction(text: str) -> float:
    """``"5%"`` or ``"0.05"`` → 0.05.

    Arguments:
        text: a percentage or a fraction.
    """
    try:
        value = float(text[:-1]) / 100 if text.strip().endswith("%") else float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 10:
        raise KitUsageError(f"threshold {text!r} is not a percentage like 5% or a fraction like 0.05.")
    return value


def parse_thresholds(items: tuple[str, ...] | list[str]) -> dict[str, float]:
    """``["ttft_ms_p50=10%"]`` → ``{"ttft_ms_p50": 0.1}``.

    Arguments:
        items: METRIC=THRESHOLD strings.
    """
    out = {}
    for item in items:
        metric, _, value = item.partition("=")
        if metric not in HIGHER_IS_BETTER:
            raise KitUsageError(f"--threshold {item!r} names no compared metric; use one of "
                                f"{', '.join(HIGHER_IS_BETTER)}.")
        out[metric] = parse_fraction(value)
    return out


def compare(base: dict[str, Any], new: dict[str, Any], max_regression: float = 0.05,
            thresholds: dict[str, float] | None = None) -> Comparison:
    """Deltas for every level and metric present in both results, and notes (missing levels, invalid runs).

    Arguments:
        base: baseline results (``summary.json``).
        new: new results.
        max_regression: allowed relative worsening.
        thresholds: per-metric overrides.
    """
    thresholds = thresholds or {}
    deltas, notes = [], []
    for level, new_metrics in new.get("levels", {}).items():
        base_metrics = base.get("levels", {}).get(level)
        if base_metrics is None:
            notes.append(f"level {level} is not in the baseline")
            continue
        for metric, higher in HIGHER_IS_BETTER.items():
            if metric not in base_metrics or metric not in new_metrics:
                continue
            b, n = base_metrics[metric]["mean"], new_metrics[metric]["mean"]
            change = (n - b) / b if b else 0.0
            limit = thresholds.get(metric, max_regression)
            worse = -change if higher else change
            deltas.append(Delta(level, metric, b, n, change, limit, worse > limit))
    for level in base.get("levels", {}):
        if level not in new.get("levels", {}):
            notes.append(f"level {level} is missing from the new results")
    if not new.get("valid", True):
        notes.append("the new results failed their sanity gates (see their report.md)")
    return Comparison(deltas, notes, not new.get("valid", True))


def compare_files(base_path: Path, new_path: Path, max_regression: str = "5%",
                  thresholds: tuple[str, ...] = ()) -> Comparison:
    """``compare`` on two ``summary.json`` files (or result directories).

    Arguments:
        base_path: baseline.
        new_path: candidate.
        max_regression: e.g. ``"5%"``.
        thresholds: METRIC=THRESHOLD overrides.
    """
    return compare(read_summary(base_path), read_summary(new_path), parse_fraction(max_regression),
                   parse_thresholds(thresholds))


def format_table(deltas: list[Delta]) -> str:
    """A fixed-width table of the deltas."""
    lines = [f"{'level':<18} {'metric':<18} {'base':>12} {'new':>12} {'change':>9} {'limit':>7}  verdict"]
    for d in deltas:
        lines.append(f"{d.level:<18} {d.metric:<18} {d.base:>12.4g} {d.new:>12.4g} {d.change:>+9.1%} "
                     f"{d.threshold:>7.1%}  {'REGRESSION' if d.regressed else 'ok'}")
    return "\n".join(lines)
