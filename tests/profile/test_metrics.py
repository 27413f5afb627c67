"""Metric definitions on hand-made records: every number below is computed by hand from the timestamps."""

from __future__ import annotations

import pytest

from trtllm_kit.errors import KitUsageError
from trtllm_kit.profile.metrics import drift, max_in_flight, parse_slo, request_metrics, stats, summarize
from trtllm_kit.profile.records import RequestRecord

MS = 1_000_000


def record(rid: str, send_ms: float, chunks_ms: list[tuple[float, int]], osl: int, end_ms: float | None = None,
           isl: int = 10, osl_server: int | None = None) -> RequestRecord:
    r = RequestRecord(rid, isl, osl, t_send_ns=int(send_ms * MS), osl_server=osl_server)
    for t, n in chunks_ms:
        r.add_chunk(int(t * MS), n)
    r.t_end_ns = int((end_ms if end_ms is not None else chunks_ms[-1][0]) * MS)
    return r


def test_request_metrics_follow_the_spec_definitions():
    # send 0; chunks at 100 (1 tok), 110 (empty, ignored), 130 (2 tok), 190 (3 tok); end 195.
    r = record("a", 0, [(100, 1), (110, 0), (130, 2), (190, 3)], osl=6, end_ms=195)
    m = request_metrics(r)
    assert m.ttft_ms == 100.0
    assert m.ttst_ms == 30.0  # second non-empty chunk - first
    assert m.chunk_gaps_ms == (30.0, 60.0)
    assert m.itl_ms == (15.0, 20.0)  # per-chunk ITL = gap / tokens of the later chunk
    assert m.tpot_ms == pytest.approx(90.0 / 5)  # (t_m - t_1) / (OSL - 1)
    assert m.e2e_ms == 195.0
    assert m.user_tok_per_s == pytest.approx(1000 / 18)


def test_single_token_request_has_no_tpot_and_empty_first_chunk_is_skipped():
    m = request_metrics(record("b", 0, [(5, 0), (40, 1)], osl=1))
    assert (m.ttft_ms, m.ttst_ms, m.tpot_ms, m.itl_ms) == (40.0, None, None, ())


def test_percentiles_interpolate_linearly_and_carry_counts():
    s = stats([10, 20, 30, 40])
    assert s["count"] == 4 and s["mean"] == 25 and s["min"] == 10 and s["max"] == 40
    assert s["p50"] == 25.0 and s["p90"] == pytest.approx(37.0) and s["p99"] == pytest.approx(39.7)
    weighted = stats([15.0, 20.0], [2, 3])  # 15,15,20,20,20
    assert weighted["count"] == 5 and weighted["p50"] == 20.0 and weighted["mean"] == 18.0
    assert stats([]) == {"count": 0}


def test_summary_aggregates_goodput_and_per_user_rates():
    a = record("a", 0, [(100, 1), (130, 2), (190, 3)], osl=6, isl=10, osl_server=6)  # TPOT 18, TTFT 100
    b = record("b", 50, [(100, 1), (150, 1), (200, 1), (250, 1)], osl=4, isl=20, osl_server=4)  # TPOT 50, TTFT 50
    c = record("c", 100, [(160, 2)], osl=3, end_ms=160, isl=30)  # length mismatch: 2 of 3
    d = RequestRecord("d", 5, 4, t_send_ns=150 * MS, t_end_ns=200 * MS)
    d.fail("server", "boom")
    s = summarize([a, b, c, d], slo=parse_slo("ttft=80,itl=40"))
    assert s["window_s"] == pytest.approx(0.25)  # first send 0 → last end 250 ms
    assert (s["num_requests"], s["num_ok"], s["num_errors"], s["errors_by_kind"]) == (4, 3, 1, {"server": 1})
    assert s["length_mismatches"] == 1 and s["server_count_mismatches"] == 0
    assert s["output_tokens"] == 6 + 4 + 2
    assert s["request_per_s"] == pytest.approx(3 / 0.25)
    assert s["output_tok_per_s"] == pytest.approx(12 / 0.25)
    assert s["total_tok_per_s"] == pytest.approx((12 + 60) / 0.25)
    assert s["ttft_ms"]["count"] == 3 and s["ttft_ms"]["p50"] == 60.0  # 100, 50, 60
    # ITL pooled per token: a: 15 x2, 20 x3; b: 50 x3; c has one chunk → none
    assert s["itl_ms"]["count"] == 8 and s["itl_ms"]["mean"] == pytest.approx((30 + 60 + 150) / 8)
    # per-user speed is the mean of 1/TPOT_i, not 1/mean(TPOT): c has TPOT 0 (one chunk of 2 tokens)
    assert s["tpot_ms"]["count"] == 3
    # goodput: a fails TTFT (100 > 80), b passes (50, TPOT 50 > 40 fails!), c is a mismatch, d failed
    assert s["goodput"]["request_per_s"] == 0.0
    s2 = summarize([a, b, c, d], slo=parse_slo("ttft=120,itl=60"))
    assert s2["goodput"]["request_per_s"] == pytest.approx(2 / 0.25)
    assert s2["goodput"]["good_fraction"] == 0.5 and s2["goodput"]["output_tok_per_s"] == pytest.approx(10 / 0.25)
    # in flight: a 0-190, b 50-250, c 100-160, d 150-200 → 4 at t=150..160
    assert s["max_in_flight"] == 4
    assert s["achieved_concurrency"] == pytest.approx((190 + 200 + 60 + 50) / 250)


def test_per_user_rate_is_mean_of_reciprocals():
    a = record("a", 0, [(10, 1), (30, 1)], osl=2)  # TPOT 20 → 50 tok/s
    b = record("b", 0, [(10, 1), (90, 1)], osl=2)  # TPOT 80 → 12.5 tok/s
    s = summarize([a, b])
    assert s["user_tok_per_s"]["mean"] == pytest.approx(31.25)  # not 1000/50 = 20
    assert s["user_tok_per_s"]["p10"] == pytest.approx(12.5 + 0.1 * 37.5)


def test_open_loop_rate_accounting():
    # 4 requests scheduled on a 1 s span at 0, 250, 500, 750 ms; the last is sent 450 ms late.
    records = []
    for i, (sched, sent) in enumerate([(0, 1), (250, 251), (500, 502), (750, 1200)]):
        r = record(f"r{i}", sent, [(sent + 10, 1)], osl=1)
        r.t_scheduled_ns = sched * MS
        records.append(r)
    s = summarize(records, window_ns=(0, 1210 * MS), offered_span_ns=1000 * MS)
    assert s["offered_rate_per_s"] == 4.0
    assert s["send_rate_per_s"] == pytest.approx(4 / 1.2)  # the pacer fell behind: span stretched to 1.2 s
    assert s["schedule_lag_ms"]["max"] == 450.0 and s["schedule_lag_ms"]["count"] == 4
    on_time = summarize(records[:3], window_ns=(0, 600 * MS), offered_span_ns=750 * MS)
    assert on_time["send_rate_per_s"] == pytest.approx(3 / 0.75)


def test_server_count_mismatch_and_max_in_flight():
    r = record("a", 0, [(10, 1), (20, 1)], osl=2, osl_server=3)
    assert r.is_server_count_mismatch and not r.is_length_mismatch
    assert max_in_flight([record("x", 0, [(10, 1)], 1), record("y", 10, [(20, 1)], 1)]) == 1  # end before send


@pytest.mark.parametrize("text", ["ttft", "ttft=abc", "speed=3", "itl=-1"])
def test_bad_slo_is_a_usage_error(text):
    with pytest.raises(KitUsageError, match="--slo"):
        parse_slo(text)


def test_slo_accepts_units():
    assert parse_slo("ttft_ms=200,itl=20ms,e2e=1000") == {"ttft": 200.0, "itl": 20.0, "e2e": 1000.0}


def test_soak_drift_slopes():
    # one request every 360 s, each ending 0.3 s after it was sent; throughput falls; the 4th request fails
    hour_ms = 3_600_000
    records = []
    for i in range(10):
        t = i * hour_ms / 10
        records.append(record(f"r{i}", t, [(t + 100, 1), (t + 100 + 10 * (i + 1), 20 - i)], osl=21 - i,
                              end_ms=t + 300))
    records[3].fail("timeout", "late")
    d = drift(records)
    assert d["bin_s"] == pytest.approx(324.03)  # last end 3240.3 s after the first send, 10 bins
    assert d["output_tok_per_s"][0] == pytest.approx(21 / d["bin_s"])
    assert d["output_tok_per_s"][3] == 0.0 and d["failures"] == [{"t_s": 1080.3, "kind": "timeout", "error": "late"}]
    # TPOT of request i = 10 (i + 1) / (20 - i) ms: rises over the hour
    assert d["tpot_p99_ms"][0] == pytest.approx(10 / 20) and d["tpot_p99_ms"][3] is None
    assert d["tpot_p99_ms_slope_per_h"] > 0 and d["output_tok_per_s_slope_per_h"] < 0
