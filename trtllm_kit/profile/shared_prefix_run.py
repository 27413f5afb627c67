"""Run the shared-prefix workload against an OpenAI endpoint: turn after turn, each turn a closed loop; then TTFT
percentiles and, for a ``serve --dynamo``, requests per worker, the prefix hit rate its routing allows (modelled)
and the hit rate its workers counted (their ``trtllm_kit:prefix_cache_*`` counters over the run)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trtllm_kit.errors import KitError
from trtllm_kit.profile import loadgen
from trtllm_kit.profile.metrics import request_metrics, stats
from trtllm_kit.profile.openai_client import OpenAIStreamClient, openai_model_name
from trtllm_kit.profile.prefix_hits import WorkerShare, modelled_hits, response_request_id, served_by, total
from trtllm_kit.profile.records import RequestRecord, write_records
from trtllm_kit.profile.shared_prefix import SharedPrefixSpec, turns
from trtllm_kit.profile.workload import WorkloadSpec, synthetic_prompts
from trtllm_kit.serve.dynamo.metrics import PrefixCounts, scrape, worker_metrics_urls

RESULT_FILE = "shared_prefix.json"
WARMUP_SEED = 1_000_003  # warm-up prompts share no block with the workload's


@dataclass
class SharedPrefixResult:
    """TTFT of every request and, when the workers are known, each worker's requests, modelled hit rate and
    counted hit rate."""

    spec: SharedPrefixSpec
    concurrency: int
    num_requests: int
    num_errors: int
    ttft_ms_p50: float
    ttft_ms_p99: float
    block_size: int | None = None
    workers: dict[str, WorkerShare] = field(default_factory=dict)
    hit_rate: float | None = None
    ideal_hit_rate: float | None = None
    counted: dict[str, PrefixCounts] = field(default_factory=dict)
    counted_hit_rate: float | None = None
    notes: list[str] = field(default_factory=list)

    def line(self) -> str:
        """One line of figures with units."""
        text = (f"{self.num_requests} requests ({self.num_errors} failed) at concurrency {self.concurrency}: "
                f"TTFT p50 {self.ttft_ms_p50:.1f} ms, p99 {self.ttft_ms_p99:.1f} ms")
        if self.hit_rate is not None and self.ideal_hit_rate is not None:
            per_worker = ", ".join(f"{name} {share.num_requests} req {share.hit_rate:.1%} hit"
                                   for name, share in sorted(self.workers.items()))
            text += (f"; prefix hit rate {self.hit_rate:.1%} of prompt tokens (ideal {self.ideal_hit_rate:.1%}, "
                     f"{self.hit_rate / self.ideal_hit_rate:.0%} of it); {per_worker}")
        if self.counted_hit_rate is not None:
            per_worker = ", ".join(f"{name} {counts.hit_rate:.1%}" for name, counts in sorted(self.counted.items()))
            text += f"; counted by the workers {self.counted_hit_rate:.1%} ({per_worker})"
        return text


class IdRecordingClient(OpenAIStreamClient):
    """The OpenAI streaming client that also keeps each request's completion ``id``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.response_ids: dict[str, str] = {}

    def _read(self, event: dict[str, Any], record: RequestRecord, now: int) -> None:  # type: ignore[override]
        if isinstance(event.get("id"), str):
            self.response_ids[record.request_id] = event["id"]
        OpenAIStreamClient._read(event, record, now)


async def run_shared_prefix(spec: SharedPrefixSpec, openai_url: str, out: Path, concurrency: int = 4,
                            dynamo_logs: Path | None = None, block_size: int | None = None,
                            model: str | None = None, api_key: str | None = None,
                            timeout_s: float = 600.0) -> SharedPrefixResult:
    """Send the workload's turns in order, write ``OUT/requests.jsonl`` and ``OUT/shared_prefix.json``.

    Arguments:
        spec: the workload.
        openai_url: the OpenAI base URL (``http://HOST:PORT/v1``).
        out: result directory.
        concurrency: requests in flight within a turn.
        dynamo_logs: a ``serve --dynamo``'s ``RUN_DIR/dynamo``: requests per worker and the hit rate.
        block_size: the workers' tokens per KV block (default: the frontend's ``/metrics``).
        model: the model name (default: the first listed).
        api_key: bearer token, if the server wants one.
        timeout_s: seconds per request.
    """
    out.mkdir(parents=True, exist_ok=True)
    (out / "requests.jsonl").unlink(missing_ok=True)
    name = model or await openai_model_name(openai_url, api_key)
    client = IdRecordingClient(openai_url, name, timeout_s, None, api_key)
    records: list[RequestRecord] = []
    prompts = {}
    try:
        warm = WorkloadSpec(isl=spec.turn_tokens, osl=spec.osl, vocab_size=spec.vocab_size, seed=WARMUP_SEED)
        await loadgen.warm_up(client, synthetic_prompts(warm, 2, 0, "w"), 2)
        before = {} if dynamo_logs is None else _counts(worker_metrics_urls(dynamo_logs))
        for number, turn in enumerate(turns(spec)):
            prompts.update({p.request_id: p.input_ids for p in turn})
            phase = await loadgen.closed_loop(client, turn, concurrency, label=f"turn{number}")
            records += phase.records
    finally:
        await client.close()
    write_records(records, out / "requests.jsonl")
    ttfts = [m.ttft_ms for m in map(request_metrics, records) if m.ttft_ms is not None]
    if not ttfts:
        raise KitError(f"none of the {len(records)} shared-prefix requests produced a token (first error: "
                       f"{next((r.error for r in records if not r.ok), '')}); check the server's log.")
    ttft = stats(ttfts)
    result = SharedPrefixResult(spec, concurrency, len(records), sum(not r.ok for r in records),
                                float(ttft["p50"]), float(ttft["p99"]))
    if dynamo_logs is not None:
        await asyncio.sleep(0.5)  # the workers' last log lines reach their files
        _add_workers(result, records, prompts, client.response_ids, served_by(dynamo_logs),
                     block_size or await frontend_block_size(openai_url))
        _add_counted(result, before, _counts(worker_metrics_urls(dynamo_logs)))
    (out / RESULT_FILE).write_text(json.dumps(asdict(result), indent=2, default=str))
    return result


def _add_workers(result: SharedPrefixResult, records: list[RequestRecord], prompts: dict[str, tuple[int, ...]],
                 response_ids: dict[str, str], workers: dict[str, str], block_size: int) -> None:
    ordered = sorted((r for r in records if r.ok), key=lambda r: r.t_send_ns)
    served = [(workers[response_request_id(response_ids[r.request_id])], prompts[r.request_id]) for r in ordered
              if r.request_id in response_ids and response_request_id(response_ids[r.request_id]) in workers]
    if len(served) < len(ordered):
        result.notes.append(f"{len(ordered) - len(served)} of {len(ordered)} requests were found in no worker "
                            "log; the hit rate counts the others.")
    result.block_size = block_size
    result.workers = modelled_hits(served, block_size)
    result.hit_rate = total(result.workers).hit_rate
    result.ideal_hit_rate = total(modelled_hits([("one", ids) for _, ids in served], block_size)).hit_rate


def _counts(urls: dict[str, str]) -> dict[str, PrefixCounts | str]:
    """Each worker's counters now, or why they could not be read (a worker that died)."""
    counts: dict[str, PrefixCounts | str] = {}
    for name, url in urls.items():
        try:
            counts[name] = scrape(url)
        except (OSError, KitError) as exc:
            counts[name] = f"{url}: {exc}"
    return counts


def _add_counted(result: SharedPrefixResult, before: dict[str, PrefixCounts | str],
                 after: dict[str, PrefixCounts | str]) -> None:
    for name in sorted(set(before) | set(after)):
        start, end = before.get(name, PrefixCounts()), after.get(name)
        if isinstance(start, str) or not isinstance(end, PrefixCounts):
            why = start if isinstance(start, str) else end or "no ready file"
            result.notes.append(f"{name}'s prefix-cache counters were not read ({why}); the counted hit rate "
                                "leaves it out.")
            continue
        result.counted[name] = end - start
    if result.counted:
        result.counted_hit_rate = sum(result.counted.values(), PrefixCounts()).hit_rate


async def frontend_block_size(openai_url: str) -> int:
    """Dynamo's ``dynamo_frontend_model_kv_cache_block_size`` from the frontend's ``/metrics``.

    Arguments:
        openai_url: the OpenAI base URL; ``/metrics`` is at its root.
    """
    import aiohttp

    root = openai_url.rstrip("/").removesuffix("/v1")
    async with aiohttp.ClientSession() as session, session.get(f"{root}/metrics") as response:
        text = await response.text()
    for line in text.splitlines():
        if line.startswith("dynamo_frontend_model_kv_cache_block_size"):
            return int(float(line.rsplit(" ", 1)[1]))
    raise KitError(f"{root}/metrics names no dynamo_frontend_model_kv_cache_block_size; pass --block-size with "
                   "the artifact's tokens_per_block.")
