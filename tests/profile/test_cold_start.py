"""`bench cold-start`: one start of a tiny cpu build, from its tar, split into artifact fetch, weight read, runtime
init, warm-up and first token; `plan --cold-start`: the same phases on a GPU node from the volume's read rate and
the target's start-up terms, and the read rate an 8B model needs to start under 30 s."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtllm_kit.artifact import Artifact
from trtllm_kit.cli import run
from trtllm_kit.profile.cold_start_plan import LLAMA_8B_BYTES, plan_cold_start


@pytest.mark.integration
@pytest.mark.slow
def test_bench_cold_start_times_each_phase(tmp_path, capsys):
    out = tmp_path / "out"
    assert run(["build", "builtin:tiny-llama", "--target", "cpu", "--no-verify", "--out", str(out)]) == 0
    capsys.readouterr()
    assert run(["bench", "cold-start", str(out), "--json"]) == 0
    measured = json.loads(capsys.readouterr().out)
    weights = sum((out / name).stat().st_size for name in Artifact.read(out).files if name.endswith(".safetensors"))
    assert measured["weight_bytes"] == weights > 1_000_000  # every weight file, read end to end
    assert measured["artifact_bytes"] > weights  # the tar held the repository and the manifest too
    phases = ("fetch_s", "weight_read_s", "runtime_init_s", "warmup_s", "first_token_s")
    assert all(measured[p] > 0 for p in phases)
    assert measured["total_s"] == pytest.approx(sum(measured[p] for p in phases), abs=0.01)
    assert measured["runtime_init_s"] > measured["first_token_s"]  # tritonserver's start, not a token, dominates
    assert not list(Path(out).glob("fetched*"))  # the copy lived in a temporary directory


def test_planned_phases_follow_the_read_rate_and_the_target():
    slow = plan_cold_start(LLAMA_8B_BYTES, "engine", 0.5)
    fast = plan_cold_start(LLAMA_8B_BYTES, "engine", 4.0)
    assert slow.weight_read_s == pytest.approx(32.12, abs=0.01) and fast.weight_read_s == pytest.approx(4.02, abs=0.01)
    assert (slow.runtime_init_s, slow.warmup_s) == (120 + 60, 0)  # the engine target's init and KV allocation
    llmapi = plan_cold_start(LLAMA_8B_BYTES, "llmapi", 0.5)
    assert (llmapi.runtime_init_s, llmapi.warmup_s) == (180 + 60, 300)  # CUDA graphs are its warm-up
    assert slow.needed_gbps == fast.needed_gbps == 0.54  # 16.06 GB within 30 s
    fetched = plan_cold_start(LLAMA_8B_BYTES, "engine", 0.5, fetch_gbps=1.0)
    assert fetched.fetch_s == pytest.approx(16.06, abs=0.01) and fetched.needed_gbps == 1.15  # 16.06 GB in 13.94 s
    assert plan_cold_start(LLAMA_8B_BYTES, "engine", 0.5, fetch_gbps=0.5).needed_gbps is None  # the fetch alone: 32 s


def test_plan_prints_the_cold_start(capsys):
    assert run(["plan", "builtin:tiny-llama", "--cold-start", "--target", "cpu", "--load-gbps", "2", "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["target"] == "cpu" and planned["runtime_init_s"] == 60
    assert planned["llama_8b"]["weight_read_s"] == 8.0 and planned["llama_8b"]["needed_gbps"] == 0.54
    assert run(["plan", "builtin:tiny-llama", "--cold-start", "--load-gbps", "0"]) == 2
    assert capsys.readouterr().err.strip() == "Error: --load-gbps 0.0 must be a positive read rate in GB/s, e.g. 2."
