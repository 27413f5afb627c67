"""The gateway as an aiohttp middleware: every request but ``/metrics``, ``/health`` and ``/version`` needs a live
key; the allowed models are checked on the body the handler serves (decoded once); the handler calls the admission
hook with the request's most tokens before it generates, which reserves them or refuses the request; the tokens it
used are settled when it ends, however it ends (answered, failed, or its client gone)."""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry

from trtllm_kit.errors import KitUsageError
from trtllm_kit.serve.gateway.keys import KeyFile, KeyRecord, read_keys
from trtllm_kit.serve.gateway.quotas import KeyLimits, Refusal
from trtllm_kit.serve.gateway.usage import UsageLog, UsageMetrics, UsageRecord
from trtllm_kit.serve.http.body import json_body
from trtllm_kit.serve.http.errors import HTTPError, error_response
from trtllm_kit.serve.http.exchange import ADMIT, CALLER, METRICS_PATH, OPEN_PATHS, ROUTE_NAME, USAGE

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
LOG = logging.getLogger(__name__)


def usage_log_path(keys_path: Path) -> Path:
    """The usage log beside a key file when none is named: ``FILE.usage.jsonl``.

    Arguments:
        keys_path: the key file.
    """
    return keys_path.with_name(keys_path.name + ".usage.jsonl")


class Refused(Exception):
    """A request the key's limits do not admit now (raised by the admission hook, answered by the middleware)."""

    def __init__(self, key: str, refusal: Refusal) -> None:
        super().__init__(refusal.reason)
        self.key, self.refusal = key, refusal

    def response(self) -> web.Response:
        """OpenAI's 429 for a quota or a rate limit, with ``Retry-After`` in whole seconds."""
        quota = self.refusal.is_quota
        error = HTTPError(f"Too many requests for the key {self.key!r}: {self.refusal.reason}; retry in "
                          f"{self.refusal.wait_s:.2f} s.", 429,
                          code="quota_exceeded" if quota else "rate_limit_exceeded",
                          kind="insufficient_quota" if quota else "rate_limit_error")
        response = error_response(error)
        response.headers["Retry-After"] = str(max(1, math.ceil(self.refusal.wait_s)))
        return response


class Gateway:
    """Keys, limits and usage of one frontend.

    Arguments:
        keys_path: the key file (re-read on SIGHUP and by ``reload``).
        usage_path: the append-only usage log (read at start to recompute the quotas).
        registry: the frontend's Prometheus registry.
    """

    def __init__(self, keys_path: Path, usage_path: Path | None, registry: CollectorRegistry) -> None:
        if not keys_path.is_file():
            raise KitUsageError(f"the key file {keys_path} does not exist; create it with trtllm-kit keys add NAME "
                                f"--keys {keys_path}.")
        self.keys_path = keys_path
        self.usage = UsageLog(usage_path or usage_log_path(keys_path))
        self.metrics = UsageMetrics(registry)
        self.keys = KeyFile(salt="")
        self.limits: dict[str, KeyLimits] = {}
        self.reload()
        for record in self.usage.records():
            if record.key in self.limits:
                self.limits[record.key].count_past(record.total_tokens, record.time)

    def reload(self) -> None:
        """Re-read the key file; a key whose limits are unchanged keeps its buckets, and every key its quota usage."""
        keys = read_keys(self.keys_path)
        limits = {}
        for record in keys.records:
            old = self.limits.get(record.name)
            if old is not None and old.record == record:
                limits[record.name] = old
            else:
                fresh = limits[record.name] = KeyLimits.of(record)
                if old is not None:  # the period's usage and the reservations in flight carry over
                    fresh.period_start, fresh.used_tokens, fresh.reserved_tokens = \
                        old.period_start, old.used_tokens, old.reserved_tokens
        self.keys, self.limits = keys, limits
        LOG.info("read %d API keys from %s", len(keys.records), self.keys_path)

    async def on_startup(self, _app: web.Application) -> None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.reload)

    async def on_cleanup(self, _app: web.Application) -> None:
        asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        self.usage.close()

    def _key(self, request: web.Request) -> KeyRecord | None:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        return self.keys.find(given.strip()) if scheme.lower() == "bearer" and given else None

    def per_key_metrics(self, request: web.Request) -> bytes:
        """The per-key series of ``/metrics`` for a request with an admin key, else nothing.

        Arguments:
            request: the scrape.
        """
        record = self._key(request)
        return self.metrics.per_key_exposition() if record is not None and record.admin else b""

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Refuse, then let the handler reserve through ``request[ADMIT]``, then settle (an aiohttp middleware
        placed inside the frontend's error middleware, which turns the ``HTTPError`` raised here into JSON)."""
        if request.path == METRICS_PATH or request.path in OPEN_PATHS:  # open; ``/metrics`` gives per-key series
            return await handler(request)
        record = self._key(request)
        if record is None:
            self.metrics.outcome("", "unauthorized")
            raise HTTPError("Incorrect, revoked or missing API key: pass a key as 'Authorization: Bearer KEY'.",
                            401, code="invalid_api_key")
        request[CALLER] = record
        routed = request.match_info.http_exception is None  # a 404 or 405 is the router's to answer
        model = (await json_body(request)).get("model") if request.method == "POST" and routed else None
        if model is not None and not record.may_use(str(model)):  # str(): the name the handler resolves
            self.metrics.outcome(record.name, "forbidden")
            raise HTTPError(f"the key {record.name!r} may not use the model {str(model)!r:.80}; it may use "
                            f"{', '.join(record.models)}.", 403, code="model_not_allowed", kind="permission_error")
        admission = Admission(self, record)
        request[ADMIT] = admission.admit
        response = None
        try:
            response = await handler(request)
            return response
        except Refused as exc:
            return exc.response()
        finally:
            admission.settle(request.get(ROUTE_NAME, ""), request.get(USAGE),
                             response is not None and response.status < 400)


class Admission:
    """One request's passage through its key's limits: the reservation, then the settlement.

    Arguments:
        gateway: the gateway; record: the request's key.
    """

    def __init__(self, gateway: Gateway, record: KeyRecord) -> None:
        self.gateway, self.record = gateway, record
        self.reservation: int | None = None

    def admit(self, reservation: int) -> None:
        """Reserve the request's most tokens, or raise ``Refused`` (the frontend calls this before generating).

        Arguments:
            reservation: prompt tokens + max_tokens.
        """
        limits = self.gateway.limits.get(self.record.name)
        if limits is None:  # dropped from the key file by a SIGHUP since the key was checked
            raise HTTPError(f"the key {self.record.name!r} is no longer in the key file.", 401,
                            code="invalid_api_key")
        refusal = limits.admit(reservation)
        if refusal is not None:
            self.gateway.metrics.outcome(self.record.name, "quota_exceeded" if refusal.is_quota else "rate_limited")
            raise Refused(self.record.name, refusal)
        self.reservation = reservation
        self.gateway.metrics.outcome(self.record.name, "admitted")

    def settle(self, model: str, usage: Callable[[], dict[str, int]] | None, succeeded: bool) -> None:
        """Replace the reservation by the tokens used: all counted ones, or none for a request that failed before
        its first token (the whole reservation when counting fails); each charged request is a line of the usage
        log.

        Arguments:
            model: the served model; usage: the run's usage counts (None when it never started); succeeded:
                whether it answered with a status below 400.
        """
        reservation, self.reservation = self.reservation, None
        if reservation is None:
            return
        tokens = reservation
        try:
            counts = usage() if usage is not None else {"prompt_tokens": 0, "completion_tokens": 0}
            if not succeeded and counts["completion_tokens"] == 0:
                counts = {"prompt_tokens": 0, "completion_tokens": 0}
            used = UsageRecord(time.time(), self.record.name, self.record.tenant, model, counts["prompt_tokens"],
                               counts["completion_tokens"])
            tokens = used.total_tokens
        finally:
            limits = self.gateway.limits.get(self.record.name)  # a SIGHUP may have replaced them, or dropped the key
            if limits is not None:
                limits.settle(reservation, tokens)
        if tokens:
            self.gateway.metrics.used(used)
            try:
                self.gateway.usage.append(used)
            except OSError:  # the answer is served and the quota charged in memory; a restart will not count it
                LOG.exception("the usage log %s could not be written; key %r, %d tokens", self.gateway.usage.path,
                              self.record.name, tokens)
