"""`trtllm-kit bench` against the kit's own repository: tiny Llama built, served by `trtllm-kit serve` (the CPU
runtime in the tensorrt_llm slot), measured over gRPC streaming and through the kit's OpenAI frontend, with forced
output lengths."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from kit_server import TINY_BUILDS, Servers

from trtllm_kit.cli import run
from trtllm_kit.profile.records import RequestRecord, read_records
from trtllm_kit.profile.report import read_summary
from trtllm_kit.serve.options import Endpoints

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@dataclass(frozen=True)
class Served:
    out: Path
    endpoints: Endpoints
    openai_port: int


@pytest.fixture(scope="module")
def served(kit_servers: Servers) -> Served:
    torch.set_num_threads(1)
    server = kit_servers.get(TINY_BUILDS["cpu"])
    return Served(server.out, server.options.endpoints, server.port)


def bench(out: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[dict, list[RequestRecord]]:
    """Run ``trtllm-kit bench ARGS`` at ISL 16 (no plots, no client-lag gate: this machine also runs the server);
    its one run's summary and its request records."""
    code = run(["bench", *args, "--isl", "16", "--no-plots", "--max-client-lag", "1000", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    return read_summary(out)["runs"][0], read_records(out / "requests.jsonl")


def test_bench_the_cpu_runtime_over_grpc(served, tmp_path, capsys):
    run_, records = bench(tmp_path / "res", capsys, "--url", f"grpc://127.0.0.1:{served.endpoints.grpc_port}",
                          "--metrics-url", f"http://127.0.0.1:{served.endpoints.metrics_port}/metrics",
                          "--concurrency", "3", "--requests", "9", "--osl", "8", "--vocab-size", "1031",
                          "--warmup", "2")
    assert run_["num_ok"] == 9 and run_["max_in_flight"] == 3
    assert run_["length_mismatches"] == 0 and run_["server_count_mismatches"] == 0
    server = run_["server_metrics"]
    assert server["request_success"] == 9  # the tensorrt_llm model's own counter
    assert server["engine_steps_per_s"] > 0 and server["kv_cache_blocks"]["max"]["max"] > 0  # nv_trt_llm_* gauges
    assert all(r.osl_observed == 8 == r.osl_server for r in records)
    assert all(r.server["first_token_ns"] >= r.server["arrival_ns"] for r in records)


def test_bench_the_openai_frontend_with_token_id_prompts(served, tmp_path, capsys):
    run_, records = bench(tmp_path / "res", capsys, "--openai-url", f"http://127.0.0.1:{served.openai_port}/v1",
                          "--metrics-url", f"http://127.0.0.1:{served.endpoints.metrics_port}/metrics",
                          "--concurrency", "4", "--requests", "12", "--osl", "12", "--vocab-size", "1024",
                          "--warmup", "2")
    assert run_["num_ok"] == 12 and run_["max_in_flight"] == 4
    assert run_["length_mismatches"] == 0 and run_["server_count_mismatches"] == 0
    assert run_["server_metrics"]["request_success"] == 12  # token ids went to tensorrt_llm itself
    assert all(r.osl_observed == 12 == r.osl_server and r.server["prompt_tokens"] == 16 for r in records)
    assert all([n for _, n in r.chunks if n] == [1] * 12 for r in records)  # one event per token: ITL per token


def test_bench_the_openai_frontend_with_text_prompts(served, tmp_path, capsys):
    run_, records = bench(tmp_path / "res", capsys, "--openai-url", f"http://127.0.0.1:{served.openai_port}/v1",
                          "--tokenizer", str(served.out / "tokenizer"), "--concurrency", "2", "--requests", "6",
                          "--osl", "12", "--vocab-size", "1024", "--warmup", "1")
    assert run_["num_ok"] == 6 and run_["length_mismatches"] == 0 and run_["server_count_mismatches"] == 0
    # text goes through the BLS; tokens are counted from the usage the frontend sends in every chunk
    assert all(sum(n for _, n in r.chunks) == 12 == r.osl_server for r in records)
    assert all(r.server["prompt_tokens"] == 16 for r in records)  # the text encodes to the requested ISL
