"""``bench --workload shared-prefix`` against a real ``serve --dynamo --workers 2``: every request answered, each
counted once on the worker whose log completed it, the routed hit rate within the ideal's bound, and the hit rate
the workers counted within the routed one."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from kit_server import BuildKey, Builds, KitServer

from trtllm_kit.cli import cli

if importlib.util.find_spec("dynamo") is None or importlib.util.find_spec("dynamo.llm") is None:
    pytest.skip("NVIDIA Dynamo is not installed (pip install -e '.[dynamo]' and the ai-dynamo wheel with --no-deps, "
                "as .ci/run does).", allow_module_level=True)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_shared_prefix_bench_names_each_request_s_worker_and_its_hits(kit_builds: Builds, tmp_path: Path) -> None:
    out = kit_builds.copy(BuildKey.of(target="cpu"), tmp_path / "out")
    with KitServer(out, dynamo=True, workers=2, router="kv") as server:
        logs = Path(server.state["run_dir"]) / "dynamo"
        result = CliRunner().invoke(cli, [
            "bench", "--workload", "shared-prefix", "--prefixes", "2", "--users", "4", "--turns", "2",
            "--prefix-tokens", "96", "--isl", "8", "--osl", "2", "--concurrency", "2", "--timeout", "120",
            "--openai-url", f"http://{server.state['dynamo_frontend']}/v1",  # Dynamo's ids, behind the kit's
            "--dynamo-logs", str(logs), "--out", str(tmp_path / "bench")])
    assert result.exit_code == 0, result.output
    assert "TTFT p50" in result.output and "prefix hit rate" in result.output
    measured = json.loads((tmp_path / "bench" / "shared_prefix.json").read_text())
    assert (measured["num_requests"], measured["num_errors"]) == (8, 0)
    assert measured["block_size"] == 32  # read from the frontend's /metrics: the artifact's tokens_per_block
    workers = measured["workers"]
    assert set(workers) <= {"worker-0", "worker-1"}
    assert sum(w["num_requests"] for w in workers.values()) == 8
    # 2 prefixes of 3 full blocks, each sent by 2 users: at best every send after the first of a prefix hits it
    assert 0 < measured["hit_rate"] <= measured["ideal_hit_rate"]
    # the workers' own counters: every prompt token looked up once; concurrent sends of a prefix may both miss it
    counted = measured["counted"]
    assert set(counted) == {"worker-0", "worker-1"}
    assert sum(c["queried_tokens"] for c in counted.values()) == sum(w["prompt_tokens"] for w in workers.values())
    assert all(0 <= c["hit_tokens"] <= workers.get(name, {}).get("hit_tokens", 0) for name, c in counted.items())
    assert 0 < measured["counted_hit_rate"] <= measured["hit_rate"]
    assert "counted by the workers" in result.output
    assert measured["ttft_ms_p50"] <= measured["ttft_ms_p99"]
