"""`trtllm-kit bench` end to end against the real stand-in server: every report file present, every PNG
decodes, the schema holds; `bench compare` exit codes on hand-made results."""

from __future__ import annotations

import copy
import csv
import json

import matplotlib.image
import pytest

from trtllm_kit.cli import run
from trtllm_kit.errors import KitError
from trtllm_kit.profile.bench import BenchSpec, default_metrics_url, run_bench
from trtllm_kit.profile.compare import compare
from trtllm_kit.profile.records import read_records
from trtllm_kit.profile.report import SCHEMA_VERSION, read_summary
from trtllm_kit.profile.workload import WorkloadSpec
from trtllm_kit.serve.server.launcher import free_port


def test_bench_writes_every_report_file(triton_server, tmp_path, capsys):
    out = tmp_path / "res"
    code = run(["bench", "--url", triton_server.grpc_url, "--metrics-url", triton_server.metrics_url,
                "--concurrency", "1,3", "--requests", "6", "--isl", "16", "--osl", "4", "--warmup", "2",
                "--slo", "ttft=60000,itl=60000", "--max-client-lag", "1000", "--out", str(out)])  # met on any machine
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert printed.out.startswith("NVML unavailable: ")  # no GPU here: one line, and the run proceeds
    files = {p.name for p in out.iterdir()}
    assert files >= {"summary.json", "summary.csv", "requests.jsonl", "telemetry.csv", "server_metrics.csv",
                     "report.md", "latency_vs_load.png", "throughput_vs_user.png", "ttft_cdf.png", "itl_cdf.png",
                     "server_metrics.png"}
    for png in out.glob("*.png"):
        assert matplotlib.image.imread(png).shape[0] > 100
    results = read_summary(out)
    assert results["schema_version"] == SCHEMA_VERSION and results["valid"]
    assert results["spec"]["levels"] == [1.0, 3.0] and results["spec"]["workload"]["isl"] == 16
    assert results["environment"]["versions"]["tritonclient"] and "gpus" in results["environment"]
    assert results["files"]["records"] == "requests.jsonl"
    runs = results["runs"]
    assert [r["max_in_flight"] for r in runs] == [1, 3]
    assert all(r["server_metrics"]["request_success"] == 6 == r["num_ok"] for r in runs)
    assert all(r["goodput"]["good_fraction"] == 1.0 for r in runs)
    records = read_records(out / "requests.jsonl")
    assert len(records) == 12 and {r.level for r in records} == {"concurrency=1", "concurrency=3"}
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert {"run_id", "metric", "stat", "value", "unit"} <= set(rows[0])
    assert any(r["metric"] == "itl_ms" and r["stat"] == "count" and r["value"] == "18" for r in rows)
    assert "| concurrency=3 #0 |" in (out / "report.md").read_text()


def test_failed_requests_make_the_point_invalid(triton_server, tmp_path, capsys):
    # 8 tokens take the stand-in 160 ms: a 30 ms timeout fails every request, and the results are still written
    code = run(["bench", "--url", triton_server.grpc_url, "--concurrency", "2", "--requests", "2", "--osl", "8",
                "--timeout", "0.03", "--warmup", "0", "--no-plots", "--out", str(tmp_path / "slow")])
    assert code == 1
    assert "failed their sanity gates (concurrency=2 #0: 2 failed requests {'timeout': 2}" in capsys.readouterr().err
    assert not read_summary(tmp_path / "slow")["valid"]
    # a missing model or server is refused before anything is sent
    code = run(["bench", "--url", triton_server.grpc_url, "--model", "no_such_model", "--concurrency", "1",
                "--requests", "2", "--warmup", "0", "--no-plots", "--out", str(tmp_path / "bad")])
    assert code == 1
    assert "model 'no_such_model' is not ready at 127.0.0.1:" in capsys.readouterr().err
    assert run(["bench", "--url", "grpc://127.0.0.1:9", "--concurrency", "1", "--requests", "1",
                "--out", str(tmp_path / "none")]) == 1
    assert "cannot reach Triton at 127.0.0.1:9 (UNAVAILABLE); start a server" in capsys.readouterr().err


def results(tok_s: float, ttft: float, valid: bool = True) -> dict:
    metric = lambda v: {"mean": v, "ci95": None, "n": 1, "cv": 0.0}  # noqa: E731
    return {"schema_version": SCHEMA_VERSION, "valid": valid, "levels": {"concurrency=4": {
        "output_tok_per_s": metric(tok_s), "request_per_s": metric(tok_s / 100), "ttft_ms_p50": metric(ttft),
        "itl_ms_p50": metric(20.0)}}}


def test_compare_thresholds():
    base = results(1000.0, 50.0)
    assert not compare(base, results(960.0, 52.0)).failed  # -4 % throughput, +4 % TTFT: within 5 %
    slower = compare(base, results(940.0, 50.0))
    assert slower.failed and [d.metric for d in slower.deltas if d.regressed] == ["output_tok_per_s",
                                                                                  "request_per_s"]
    assert compare(base, results(2000.0, 40.0)).deltas[0].change == 1.0  # improvements never fail
    assert not compare(base, results(1000.0, 56.0), thresholds={"ttft_ms_p50": 0.2}).failed
    assert compare(base, results(1000.0, 50.0, valid=False)).failed


def test_compare_cli_exit_codes(tmp_path, capsys):
    base, same, worse = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    base.write_text(json.dumps(results(1000.0, 50.0)))
    same.write_text(json.dumps(results(1010.0, 49.0)))
    worse.write_text(json.dumps(results(1000.0, 60.0)))
    assert run(["bench", "compare", str(base), str(same), "--max-regression", "5%"]) == 0
    assert run(["bench", "compare", str(base), str(worse), "--max-regression", "5%"]) == 1
    err = capsys.readouterr()
    assert "ttft_ms_p50" in err.out and "REGRESSION" in err.out
    assert "Error: regression against" in err.err and "ttft_ms_p50 +20.0%" in err.err
    assert run(["bench", "compare", str(base), str(worse), "--threshold", "ttft_ms_p50=25%"]) == 0
    assert run(["bench", "compare", str(base), str(worse), "--max-regression", "lots"]) == 2
    old = copy.deepcopy(results(1.0, 1.0))
    old["schema_version"] = "0.3"
    (tmp_path / "old.json").write_text(json.dumps(old))
    with pytest.raises(KitError, match=r"schema_version '0\.3'"):
        read_summary(tmp_path / "old.json")


def test_bench_usage_errors(tmp_path, capsys):
    assert run(["bench", "--concurrency", "2", "--rate", "3", "--requests", "1", "--out", str(tmp_path)]) == 2
    assert "choose one load mode" in capsys.readouterr().err
    assert run(["bench", "--concurrency", "2", "--out", str(tmp_path)]) == 2
    assert "--requests N or --duration" in capsys.readouterr().err
    assert run(["bench", "--concurrency", "2", "--requests", "1"]) == 2
    assert run(["bench", "--offline", "--duration", "5", "--out", str(tmp_path)]) == 2
    assert "--offline submits a fixed set" in capsys.readouterr().err


def test_an_unreachable_server_is_one_sentence(tmp_path, capsys):
    assert run(["bench", "--url", "grpc://127.0.0.1:1", "--concurrency", "1", "--requests", "2",
                "--out", str(tmp_path / "res")]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "Error: cannot reach Triton at 127.0.0.1:1 (UNAVAILABLE); start a server with `trtllm-kit serve OUT` or "
        "pass --url grpc://HOST:PORT."]


@pytest.mark.parametrize(("endpoint", "expected"), [
    ("grpc://127.0.0.1:8001", "http://127.0.0.1:8002/metrics"), ("10.0.0.5:9001", "http://10.0.0.5:8002/metrics"),
    ("http://gpu-box:9000/v1", "http://gpu-box:8002/metrics"), ("grpc://[::1]:8001", "http://[::1]:8002/metrics"),
])
def test_metrics_are_looked_for_on_the_endpoints_host(endpoint, expected):
    assert default_metrics_url(endpoint) == expected


def test_inferred_metrics_url_is_used_only_if_triton_answers_there(triton_server, tmp_path):
    def bench(metrics_url: str, out: str) -> dict:
        spec = BenchSpec(out=tmp_path / out, url=triton_server.grpc_url, num_requests=2, warmup_requests=0,
                         workload=WorkloadSpec(isl=8, osl=2), metrics_url=metrics_url, metrics_url_given=False,
                         plots=False, max_loop_lag_ms=1000)
        return run_bench(spec)

    closed = f"http://127.0.0.1:{free_port()}/metrics"
    missing = bench(closed, "missing")
    (note,) = missing["notes"]
    assert missing["valid"] and note.startswith(f"no Triton metrics are scraped (cannot scrape {closed}: "
                                                "ClientConnectorError")
    assert note.endswith("; pass --metrics-url http://HOST:PORT/metrics for queue time and KV-cache figures.")
    assert f"Note: {missing['notes'][0]}" in (tmp_path / "missing" / "report.md").read_text()
    assert missing["runs"][0]["server_metrics"] is None
    found = bench(triton_server.metrics_url, "found")
    assert found["notes"] == [] and found["runs"][0]["server_metrics"]["request_success"] == 2
