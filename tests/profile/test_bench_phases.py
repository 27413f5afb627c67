"""``bench --phases`` against a real ``serve --disagg`` of a tiny llmapi build (CPU): prefill tokens/s, decode
tokens/s per sequence and the KV transfer per request written to phases.json, each request counted once by the
generation server's transfer gauges; ``plan --disagg --phases`` reads the file. No timing is asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kit_server import TINY_BUILDS, Builds, KitServer

from trtllm_kit.cli import run


@pytest.mark.integration
def test_phases_of_a_disaggregated_serve(kit_builds: Builds, tmp_path: Path, capsys) -> None:
    out = kit_builds.copy(TINY_BUILDS["llmapi"], tmp_path / "out")
    with KitServer(out, disagg=True) as server:  # its own: every transfer of the run is counted
        capsys.readouterr()
        assert run(["bench", "--phases", "--openai-url", f"{server.url}/v1", "--metrics-url",
                    f"http://{server.metrics}/metrics", "--isl", "64", "--osl", "8", "--prefill-batch",
                    "3", "--decode-concurrency", "2", "--repeats", "2", "--warmup", "1", "--out",
                    str(tmp_path / "phases")]) == 0
    printed = capsys.readouterr().out
    assert "tokens/s at batch 3 x ISL 64" in printed and "KV transfer" in printed
    phases = json.loads((tmp_path / "phases" / "phases.json").read_text())
    assert phases["prefill_tokens_s"] > 0 and phases["decode_tokens_s_per_seq"] > 0
    assert phases["num_kv_transfers"] == 1 + 2 * 3 + 2 * 2  # every request of the run, once
    assert phases["kv_transfer_ms_per_request"] > 0
    assert run(["plan", "builtin:tiny-llama", "--disagg", "--phases", str(tmp_path / "phases" / "phases.json"),
                "--isl", "64", "--osl", "8"]) == 0
    assert capsys.readouterr().out.startswith("measured (bench --phases")
