"""``trtllm-kit bench --phases``: the two phases' throughput of a served artifact, as ``plan --disagg --phases``
takes them (``disagg_plan.MeasuredPhases``, written as ``phases.json``).

* prefill: ``prefill_batch`` requests of ``isl`` tokens and one output token each, sent at once;
  ``prefill_tokens_s`` = batch x ISL / the seconds from the first send to the last answer (TTFT p50 beside it);
* decode: ``decode_concurrency`` streamed requests of ``osl`` tokens (ISL as above) sent at once; per sequence
  (tokens after its first) / (its last token's time - its first's), averaged: ``decode_tokens_s_per_seq``, with
  the ITL p50;
* KV transfer (a ``serve --disagg``): the generation server's ``trtllm_kit_kv_transfer_metrics`` gauges before and
  after (``--metrics-url``: its metrics port, which is the serve's ``--metrics-port``), seconds over transfers.

Both phases follow ``warmup`` untimed requests (``--warmup``); each is measured over ``rounds`` rounds
(``--repeats``) and the median round is kept. Prompts are synthetic and seeded.
"""

from __future__ import annotations

import asyncio
import json
import statistics
from dataclasses import asdict, dataclass
from itertools import pairwise
from pathlib import Path

from trtllm_kit.disagg_plan import MeasuredPhases
from trtllm_kit.errors import KitError, KitUsageError
from trtllm_kit.profile.clients import StreamClient
from trtllm_kit.profile.loadgen import offline, warm_up
from trtllm_kit.profile.records import RequestRecord
from trtllm_kit.profile.triton_metrics import MetricsScraper, kv_transfer
from trtllm_kit.profile.workload import WorkloadSpec, synthetic_prompts

PHASES_FILE = "phases.json"
GAUGE_LAG_S = 1.5  # the llmapi model publishes its gauges twice a second


@dataclass(frozen=True)
class PhasesSpec:
    """What ``bench --phases`` measures: the phases' shapes, rounds and where the metrics are."""

    out: Path
    isl: int = 128
    osl: int = 128
    prefill_batch: int = 4
    decode_concurrency: int = 4
    rounds: int = 1
    warmup: int = 4
    vocab_size: int = 1000
    seed: int = 0
    metrics_url: str | None = None

    def __post_init__(self) -> None:
        if min(self.isl, self.prefill_batch, self.decode_concurrency, self.rounds) < 1 or self.osl < 2:
            raise KitUsageError(f"--isl {self.isl}, --prefill-batch {self.prefill_batch}, --decode-concurrency "
                                f"{self.decode_concurrency} must be at least 1 and --osl {self.osl} at least 2 (a "
                                "decode rate needs two tokens).")


def _decode_rate(record: RequestRecord) -> float:
    times = record.token_times_ns
    tokens = sum(n for _, n in times[1:])
    return tokens / ((times[-1][0] - times[0][0]) / 1e9) if len(times) > 1 and times[-1][0] > times[0][0] else 0.0


def _itls_ms(record: RequestRecord) -> list[float]:
    times = record.token_times_ns
    return [(b - a) / 1e6 / n for (a, _), (b, n) in pairwise(times)]


def _failed(records: list[RequestRecord]) -> None:
    bad = [r for r in records if not r.ok]
    if bad:
        raise KitError(f"{len(bad)} of {len(records)} phase requests failed ({bad[0].error_kind}: "
                       f"{bad[0].error[:200]}); fix the server and measure again.")


async def measure_phases(spec: PhasesSpec, client: StreamClient) -> MeasuredPhases:
    """Measure both phases through ``client`` and write ``phases.json`` into ``spec.out``.

    Arguments:
        spec: the shapes and rounds; client: a streaming client of the served model.
    """
    def prompts(count: int, osl: int, prefix: str) -> list:
        work = WorkloadSpec(isl=spec.isl, osl=osl, vocab_size=spec.vocab_size, seed=spec.seed)
        return synthetic_prompts(work, count, prefix=prefix)

    scraper = MetricsScraper(spec.metrics_url) if spec.metrics_url else None
    before = await scraper.scrape() if scraper else None
    await warm_up(client, prompts(spec.warmup, 1, "w"), spec.warmup)
    prefill = []
    for i in range(spec.rounds):
        result = await offline(client, prompts(spec.prefill_batch, 1, f"p{i}-"))
        _failed(result.records)
        seconds = (max(r.t_end_ns for r in result.records) - min(r.t_send_ns for r in result.records)) / 1e9
        ttft = statistics.median(r.token_times_ns[0][0] - r.t_send_ns for r in result.records) / 1e6
        prefill.append((spec.prefill_batch * spec.isl / seconds, ttft))
    decode = []
    for i in range(spec.rounds):
        result = await offline(client, prompts(spec.decode_concurrency, spec.osl, f"d{i}-"))
        _failed(result.records)
        itls = [v for r in result.records for v in _itls_ms(r)]
        decode.append((statistics.mean(_decode_rate(r) for r in result.records), statistics.median(itls)))
    if scraper:
        await asyncio.sleep(GAUGE_LAG_S)  # the last requests' transfers reach the gauges
    after = await scraper.scrape() if scraper else None
    transfer_ms, num_transfers = kv_transfer(before, after) if before and after else (None, 0)
    prefill_tokens_s, ttft_ms = sorted(prefill)[len(prefill) // 2]
    decode_rate, itl_ms = sorted(decode)[len(decode) // 2]
    phases = MeasuredPhases(prefill_batch=spec.prefill_batch, isl=spec.isl, prefill_tokens_s=prefill_tokens_s,
                            ttft_ms_p50=ttft_ms, decode_concurrency=spec.decode_concurrency, osl=spec.osl,
                            decode_tokens_s_per_seq=decode_rate, itl_ms_p50=itl_ms,
                            kv_transfer_ms_per_request=transfer_ms, num_kv_transfers=num_transfers)
    spec.out.mkdir(parents=True, exist_ok=True)
    (spec.out / PHASES_FILE).write_text(json.dumps({**asdict(phases), "spec": {**asdict(spec), "out": str(spec.out)}},
                                                   indent=2) + "\n")
    return phases


def run_phases(spec: PhasesSpec, make_client) -> MeasuredPhases:
    """Synchronous entry point for the CLI.

    Arguments:
        spec: the measurement; make_client: an async callable returning the started client (closed here).
    """
    async def go() -> MeasuredPhases:
        client = await make_client()
        try:
            return await measure_phases(spec, client)
        finally:
            await client.close()

    return asyncio.run(go())
