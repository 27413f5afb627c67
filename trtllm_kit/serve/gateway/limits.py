"""Per-key admission: a requests-per-second and a tokens-per-minute token bucket, and a token quota per period.

Token costs are known only when a request ends, so the tokens-per-minute bucket admits while its level is above
zero and is charged afterwards (it may go negative, which delays the next request until it refills); the quota
admits while the period's usage is below it. Either way at most one request goes over the configured number.
"""

from __future__ import annotations

import calendar
import math
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

from trtllm_kit.serve.gateway.keys import KeyRecord


@dataclass
class TokenBucket:
    """A bucket of ``capacity`` refilled at ``rate`` per second, full at first."""

    rate: float
    capacity: float
    level: float = field(init=False)
    stamp: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.level = self.capacity

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now

    def wait_for(self, amount: float, now: float) -> float:
        """Seconds until the level reaches ``amount`` (0 when it already has)."""
        self.refill(now)
        return max(0.0, (amount - self.level) / self.rate)

    def take(self, amount: float, now: float) -> None:
        self.refill(now)
        self.level -= amount


def period_bounds(period: str, at: float) -> tuple[float, float]:
    """The UTC day or month holding the time ``at``, as (start, end) epoch seconds.

    Arguments:
        period: ``day`` or ``month``; at: epoch seconds.
    """
    t = datetime.fromtimestamp(at, timezone.utc)
    if period == "day":
        start = datetime(t.year, t.month, t.day, tzinfo=timezone.utc).timestamp()
        return start, start + 86400
    start = datetime(t.year, t.month, 1, tzinfo=timezone.utc).timestamp()
    return start, start + 86400 * calendar.monthrange(t.year, t.month)[1]


@dataclass
class KeyLimits:
    """One key's buckets and its usage in the current quota period."""

    record: KeyRecord
    requests: TokenBucket | None = None
    tokens: TokenBucket | None = None
    period_start: float = 0.0
    used_tokens: int = 0

    @classmethod
    def of(cls, record: KeyRecord) -> KeyLimits:
        """Fresh limits for ``record`` (full buckets, nothing used).

        Arguments:
            record: the key.
        """
        requests = TokenBucket(record.rps, max(1.0, record.rps)) if record.rps else None
        tokens = TokenBucket(record.tpm / 60.0, float(record.tpm)) if record.tpm else None
        return cls(record, requests, tokens)

    def count_past(self, tokens: int, at: float) -> None:
        """Count tokens used at ``at`` (from the usage log) toward the quota.

        Arguments:
            tokens: prompt plus completion tokens; at: epoch seconds.
        """
        if self.record.quota_period is not None:
            start, end = period_bounds(self.record.quota_period, time.time())
            if start <= at < end:
                self.period_start, self.used_tokens = start, self.used_tokens + tokens

    def retry_after(self) -> tuple[float, str] | None:
        """Seconds to wait and why, or None when a request may start now (and then one is taken)."""
        now, wall = time.monotonic(), time.time()
        if self.record.quota_tokens is not None and self.record.quota_period is not None:
            start, end = period_bounds(self.record.quota_period, wall)
            if start != self.period_start:
                self.period_start, self.used_tokens = start, 0
            if self.used_tokens >= self.record.quota_tokens:
                adjective = "daily" if self.record.quota_period == "day" else "monthly"
                return end - wall, (f"the {adjective} quota of {self.record.quota_tokens} tokens is "
                                    f"used ({self.used_tokens})")
        if self.tokens is not None:
            wait = self.tokens.wait_for(math.ulp(0.0), now)
            if wait > 0:
                return wait, f"the limit of {self.record.tpm} tokens per minute is reached"
        if self.requests is not None:
            wait = self.requests.wait_for(1.0, now)
            if wait > 0:
                return wait, f"the limit of {self.record.rps:g} requests per second is reached"
            self.requests.take(1.0, now)
        return None

    def charge(self, tokens: int) -> None:
        """Charge a finished request's tokens to the minute bucket and the quota.

        Arguments:
            tokens: prompt plus completion tokens.
        """
        if self.tokens is not None:
            self.tokens.take(tokens, time.monotonic())
        self.used_tokens += tokens
