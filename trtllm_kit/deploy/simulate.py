"""Replay a metric series through the Horizontal Pod Autoscaler's algorithm (KEDA drives an HPA too).

Every sync period the HPA computes ``desired = ceil(current x metric / target)`` with ``metric`` the per-replica
average (``AverageValue``: the query's value / current replicas), keeps ``current`` when the ratio is within the
tolerance (10 %), then stabilises: up to the lowest recommendation of the scale-up window, down to the highest
of the scale-down window; then the policies cap the change per period, and min/max clamp it.

The replay holds the recorded series fixed: it shows what the autoscaler would have decided on that demand, not
how added replicas would have shortened the queue.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trtllm_kit.errors import KitUsageError

SYNC_S = 15.0
TOLERANCE = 0.1


@dataclass(frozen=True)
class Policy:
    kind: str  # Pods or Percent
    value: int
    period_s: int


@dataclass(frozen=True)
class Rules:
    """One direction's behaviour: stabilisation window, policies and how they combine."""

    window_s: int
    policies: tuple[Policy, ...]
    select: str = "Max"

    @classmethod
    def from_dict(cls, body: dict[str, Any], default_window: int) -> Rules:
        policies = tuple(Policy(p["type"], int(p["value"]), int(p["periodSeconds"])) for p in body.get("policies", ()))
        window = int(body.get("stabilizationWindowSeconds", default_window))
        return cls(window, policies, body.get("selectPolicy", "Max"))


@dataclass(frozen=True)
class ScalingSpec:
    """What the autoscaler of a deploy directory does: bounds, target per replica, behaviour, its query."""

    min_replicas: int
    max_replicas: int
    target: float
    up: Rules
    down: Rules
    query: str | None = None


@dataclass(frozen=True)
class Step:
    """One sync: the query's value, the raw recommendation and the replicas after stabilisation and policies."""

    t: float
    value: float | None
    recommended: int
    replicas: int


def scaling_spec(directory: Path) -> ScalingSpec:
    """Read the ScaledObject or HPA of a ``deploy k8s`` output.

    Arguments:
        directory: the deploy directory.
    """
    for name in ("scaledobject.yaml", "hpa.yaml"):
        path = directory / name
        if path.is_file():
            spec = yaml.safe_load(path.read_text())["spec"]
            break
    else:
        raise KitUsageError(f"{directory} has no scaledobject.yaml or hpa.yaml; write it with trtllm-kit deploy k8s "
                            "--autoscaler keda or hpa.")
    if "triggers" in spec:  # KEDA
        trigger = spec["triggers"][0]
        behavior = spec.get("advanced", {}).get("horizontalPodAutoscalerConfig", {}).get("behavior", {})
        bounds = (int(spec.get("minReplicaCount", 0)) or 1, int(spec.get("maxReplicaCount", 100)))
        target, query = float(trigger["metadata"]["threshold"]), trigger["metadata"]["query"]
    else:
        behavior = spec.get("behavior", {})
        bounds = (int(spec.get("minReplicas", 1)), int(spec["maxReplicas"]))
        target, query = _quantity(spec["metrics"][0]["pods"]["target"]["averageValue"]), None
    return ScalingSpec(*bounds, target, Rules.from_dict(behavior.get("scaleUp", {}), 0),
                       Rules.from_dict(behavior.get("scaleDown", {}), 300), query)


def _quantity(text: str | int | float) -> float:
    text = str(text)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def _limit(rules: Rules, start: int, up: bool) -> int | None:
    """The furthest the policies let replicas move from ``start`` (the count one period ago)."""
    limits = []
    for policy in rules.policies:
        if policy.kind == "Pods":
            limits.append(start + policy.value if up else start - policy.value)
        else:
            change = start * policy.value / 100
            limits.append(math.ceil(start + change) if up else math.floor(start - change))
    if not limits or rules.select == "Disabled":
        return None if not limits else start
    pick_max = (rules.select == "Max") == up
    return max(limits) if pick_max else min(limits)


def replay(series: list[tuple[float, float]], spec: ScalingSpec, *, sync_s: float = SYNC_S,
           start_replicas: int | None = None, until: float | None = None) -> list[Step]:
    """The replica count over time the autoscaler would choose for ``series``.

    Arguments:
        series: (unix time, query value) samples, sorted; the value holds until the next sample.
        spec: the autoscaler; sync_s: its sync period; start_replicas: replicas at the start (min when omitted);
        until: replay up to this time (the last value holding; default the last sample).
    """
    if not series:
        raise KitUsageError("the series is empty; scrape a range that holds samples of the autoscaler's query.")
    replicas = start_replicas or spec.min_replicas
    history: list[tuple[float, int]] = [(-math.inf, replicas)]  # (t, replicas from t on)
    recommendations: list[tuple[float, int]] = []
    steps, index, t = [], 0, series[0][0]
    end = until if until is not None else series[-1][0]
    while t <= end:
        while index + 1 < len(series) and series[index + 1][0] <= t:
            index += 1
        value = series[index][1] if not math.isnan(series[index][1]) else None
        ratio = None if value is None else value / replicas / spec.target
        raw = replicas if ratio is None or abs(ratio - 1) <= TOLERANCE else math.ceil(replicas * ratio)
        recommendations.append((t, raw))
        up_rec = min(r for tt, r in recommendations if tt > t - spec.up.window_s or tt == t)
        down_rec = max(r for tt, r in recommendations if tt > t - spec.down.window_s or tt == t)
        wanted = max(replicas, up_rec) if up_rec > replicas else min(replicas, down_rec)
        rules, up = (spec.up, True) if wanted > replicas else (spec.down, False)
        if wanted != replicas:
            period = max((p.period_s for p in rules.policies), default=0)
            start = next(r for tt, r in reversed(history) if tt <= t - period)  # the count one period ago
            limit = _limit(rules, start, up)
            if limit is not None:
                wanted = min(wanted, max(limit, replicas)) if up else max(wanted, min(limit, replicas))
        replicas = min(max(wanted, spec.min_replicas), spec.max_replicas)
        history.append((t, replicas))
        steps.append(Step(t, value, raw, replicas))
        t += sync_s
    return steps
