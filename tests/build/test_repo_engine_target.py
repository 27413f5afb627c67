"""The repo stage for the engine target, after the faked trtllm-build on a faked H100 host: the C++ backend's
configuration from the engine's own config.json and the plan, validated clean."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import FakeTrtllmBuild

from trtllm_kit.artifact.machine import Machine
from trtllm_kit.cli import run
from trtllm_kit.model_repo.configs import parse_config


def test_engine_target_repository(tmp_path: Path, fake_trtllm_build: FakeTrtllmBuild, gpu_host: Machine,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code = run(["build", "builtin:tiny-llama", "--tp", "2", "--no-verify", "--max-batch-size", "8", "--max-seq-len",
                "128", "--out", str(out), "--json"])
    assert code == 0, capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["summary"]["stages"] == ["checkpoint", "engine", "repo"]
    assert manifest["summary"]["repo"]["target"] == "engine"
    trt = parse_config((out / "repo" / "tensorrt_llm" / "config.pbtxt").read_text())
    params = {k: v.string_value for k, v in trt.parameters.items()}
    assert (trt.backend, trt.max_batch_size) == ("tensorrtllm", 8)
    assert params["gpt_model_path"] == str(out.absolute() / "engines")
    assert params["kv_cache_free_gpu_mem_fraction"] == str(manifest["summary"]["engine"]["plan"]["kv_cache_fraction"])
    assert params["max_tokens_in_paged_kv_cache"] == str(8 * 128)
    assert (params["enable_kv_cache_reuse"], params["enable_chunked_context"]) == ("true", "true")
    assert not (out / "repo" / "tensorrt_llm" / "1" / "model.py").exists()
    assert [p.name for p in (out / "repo" / "tensorrt_llm" / "1").iterdir()] == []
    capsys.readouterr()
    assert run(["validate", str(out), "--json"]) == 0
    assert [f for f in json.loads(capsys.readouterr().out)["findings"] if f["severity"] == "error"] == []
