"""The gateway as an aiohttp middleware: every ``/v1/*`` request needs a live key; limits, quotas and allowed
models are checked before the request reaches a model; the tokens it used are charged when it ends."""

from __future__ import annotations

import asyncio
import json
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
from trtllm_kit.serve.gateway.limits import KeyLimits
from trtllm_kit.serve.gateway.usage import UsageLog, UsageMetrics, UsageRecord

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
LOG = logging.getLogger(__name__)


def usage_log_path(keys_path: Path) -> Path:
    """The usage log beside a key file when none is named: ``FILE.usage.jsonl``.

    Arguments:
        keys_path: the key file.
    """
    return keys_path.with_name(keys_path.name + ".usage.jsonl")


def _error(message: str, status: int, code: str, kind: str, headers: dict[str, str] | None = None) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return web.json_response(body, status=status, headers=headers)


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
        """Re-read the key file; a key whose limits are unchanged keeps its buckets and quota usage."""
        keys = read_keys(self.keys_path)
        limits = {}
        for record in keys.records:
            old = self.limits.get(record.name)
            if old is not None and old.record == record:
                limits[record.name] = old
            else:
                limits[record.name] = KeyLimits.of(record)
                if old is not None:
                    limits[record.name].period_start, limits[record.name].used_tokens = old.period_start, \
                        old.used_tokens
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

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Refuse, admit, then charge (an aiohttp middleware placed before the frontend's own)."""
        if not request.path.startswith("/v1/"):
            return await handler(request)
        record = self._key(request)
        if record is None:
            self.metrics.requests.labels("", "unauthorized").inc()
            return _error("Incorrect, revoked or missing API key: pass a key as 'Authorization: Bearer KEY'.", 401,
                          "invalid_api_key", "invalid_request_error")
        model = None
        if request.method == "POST" and request.can_read_body:
            try:
                body = await request.json()  # aiohttp keeps the body; the handler reads it again
                model = body.get("model") if isinstance(body, dict) else None
            except (json.JSONDecodeError, UnicodeDecodeError):
                pass  # the handler answers 400
        if isinstance(model, str) and not record.may_use(model):
            self.metrics.requests.labels(record.name, "forbidden").inc()
            return _error(f"the key {record.name!r} may not use the model {model!r}; it may use "
                          f"{', '.join(record.models)}.", 403, "model_not_allowed", "permission_error")
        limits = self.limits[record.name]
        refused = limits.retry_after()
        if refused is not None:
            wait, why = refused
            outcome = "quota_exceeded" if "quota" in why else "rate_limited"
            self.metrics.requests.labels(record.name, outcome).inc()
            return _error(f"Too many requests for the key {record.name!r}: {why}; retry in {wait:.2f} s.", 429,
                          outcome if outcome == "quota_exceeded" else "rate_limit_exceeded",
                          "insufficient_quota" if outcome == "quota_exceeded" else "rate_limit_error",
                          {"Retry-After": str(max(1, math.ceil(wait)))})
        self.metrics.requests.labels(record.name, "admitted").inc()
        try:
            return await handler(request)
        finally:
            usage = request.get("usage")
            if usage is not None and isinstance(model, str):
                counts = usage()
                used = UsageRecord(time.time(), record.name, record.tenant, model, counts["prompt_tokens"],
                                   counts["completion_tokens"])
                limits.charge(used.total_tokens)
                self.metrics.used(used)
                self.usage.append(used)
