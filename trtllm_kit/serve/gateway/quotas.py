"""Per-key admission: a requests-per-second and a tokens-per-minute token bucket, and a token quota per period.

A request's real cost is known only when it ends, so admission reserves its most: prompt tokens + ``max_tokens``
(× n, which the frontend holds at 1). The quota admits while the period's settled usage plus the reservations in
flight is below it; the tokens-per-minute bucket admits while its level is above zero, and takes the reservation
at once (it may go negative, which delays the next request until it refills). When the request ends, its
reservation is replaced by the tokens it used. Check and reservation happen in one step of the event loop, so
concurrent requests see each other's reservations: the tokens of a quota period never exceed the quota plus the
reservation of one request (the last one admitted), and a burst on the minute bucket never exceeds its capacity
plus one reservation.
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
        """Take ``amount`` (a negative amount gives back, up to the capacity)."""
        self.refill(now)
        self.level = min(self.capacity, self.level - amount)


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


@dataclass(frozen=True)
class Refusal:
    """Why a request may not start now, and for how long."""

    wait_s: float
    reason: str
    is_quota: bool


@dataclass
class KeyLimits:
    """One key's buckets, its settled usage in the current quota period and the tokens reserved in flight."""

    record: KeyRecord
    requests: TokenBucket | None = None
    tokens: TokenBucket | None = None
    period_start: float = 0.0
    used_tokens: int = 0
    reserved_tokens: int = 0

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

    def refusal(self) -> Refusal | None:
        """Why a request may not start now, or None (nothing is taken)."""
        now, wall = time.monotonic(), time.time()
        quota, period = self.record.quota_tokens, self.record.quota_period
        if quota is not None and period is not None:
            start, end = period_bounds(period, wall)
            if start != self.period_start:
                self.period_start, self.used_tokens = start, 0
            if self.used_tokens + self.reserved_tokens >= quota:
                adjective = "daily" if period == "day" else "monthly"
                return Refusal(end - wall, f"the {adjective} quota of {quota} tokens is used ({self.used_tokens} "
                                           f"used, {self.reserved_tokens} reserved by requests in flight)", True)
        if self.tokens is not None:
            wait = self.tokens.wait_for(math.ulp(0.0), now)
            if wait > 0:
                return Refusal(wait, f"the limit of {self.record.tpm} tokens per minute is reached", False)
        if self.requests is not None:
            wait = self.requests.wait_for(1.0, now)
            if wait > 0:
                return Refusal(wait, f"the limit of {self.record.rps:g} requests per second is reached", False)
        return None

    def admit(self, reservation: int) -> Refusal | None:
        """Reserve ``reservation`` tokens and one request, or say why not (then nothing is taken).

        Arguments:
            reservation: the most tokens the request can use (prompt + max_tokens).
        """
        refused = self.refusal()
        if refused is not None:
            return refused
        now = time.monotonic()
        if self.requests is not None:
            self.requests.take(1.0, now)
        if self.tokens is not None:
            self.tokens.take(reservation, now)
        self.reserved_tokens += reservation
        return None

    def settle(self, reservation: int, tokens: int) -> None:
        """Replace an admitted request's reservation by the tokens it used.

        Arguments:
            reservation: what ``admit`` reserved; tokens: prompt plus completion tokens used (0 when it failed
                before its first token).
        """
        if self.tokens is not None:
            self.tokens.take(tokens - reservation, time.monotonic())
        self.reserved_tokens -= reservation
        self.used_tokens += tokens
