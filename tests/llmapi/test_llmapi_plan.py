"""``plan --target llmapi`` and ``build --dry-run``: the PyTorch backend's recipe and memory per rank (weights
after load-time sharding, CUDA-graph pool, KV pool) and the trtllm-serve command; no engine plan, no
trtllm-build line; with a named GPU and on this (GPU-less) machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtllm_kit.cli import run
from trtllm_kit.gpus import resolve_gpu
from trtllm_kit.llmapi.recipe import GRAPH_OVERHEAD, cuda_graph_batch_sizes
from trtllm_kit.mapping import Mapping
from trtllm_kit.models.hf_config import read_hf_config
from trtllm_kit.models.inspect import resolve_model_path
from trtllm_kit.models.registry import family_for
from trtllm_kit.plan import rank_weight_bytes
from trtllm_kit.precision import Precision

MODEL = "builtin:tiny-llama"


def plan_json(capsys: pytest.CaptureFixture[str], *flags: str) -> dict:
    assert run(["plan", MODEL, "--target", "llmapi", "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_with_a_gpu_models_this_paths_memory(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    report = plan_json(capsys, "--gpu", "H100-80GB", "--tp", "2", "--quant", "fp8", "--out", str(tmp_path / "o"))
    body = report["llmapi"]
    assert report["plan"] is None and report["commands"] == [] and "fusion" not in report
    hf = read_hf_config(resolve_model_path(MODEL))
    weights = rank_weight_bytes(hf, family_for(hf, MODEL), Mapping(2, 1), Precision("float16", "FP8"))
    assert [r["weight_bytes"] for r in body["ranks"]] == weights
    batch = body["llm_args"]["max_batch_size"]
    sizes = body["cuda_graph_batch_sizes"]
    assert sizes == cuda_graph_batch_sizes(batch) and sizes[-1] == batch
    assert body["cuda_graph_pool_bytes"] >= GRAPH_OVERHEAD * len(body["cuda_graph_batch_sizes"])
    gpu = resolve_gpu("H100-80GB", None, [])
    for r in body["ranks"]:
        left = gpu.memory_bytes - r["cuda_graph_pool_bytes"] - r["weight_bytes"] - r["activation_bytes"] - \
            r["buffer_bytes"]
        assert r["kv_pool_bytes"] == int(0.9 * left) and r["fits"] and r["num_blocks"] > 0
    assert body["llm_args"]["tensor_parallel_size"] == 2 and body["llm_args"]["cuda_graph_config"]["max_batch_size"] \
        == batch
    assert any("FP8 per-tensor GEMMs" in note for note in body["notes"])
    assert body["serve_command"][:2] == ["trtllm-serve", str((tmp_path / "o" / "checkpoint").absolute())]


def test_plan_text_names_the_recipe_not_the_engine(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["plan", MODEL, "--target", "llmapi", "--gpu", "H100-80GB", "--kv-cache", "fp8"]) == 0
    text = capsys.readouterr().out
    assert "trtllm-build" not in text and "CUDA graphs MiB" in text and "KV pool GiB" in text
    assert "FP8 KV cache with paged context FMHA" in text and "trtllm-serve command" in text


@pytest.mark.parametrize("command", [["plan", MODEL], ["build", MODEL, "--dry-run"]])
def test_plan_without_a_gpu_still_gives_weights_per_rank(command: list[str], capsys: pytest.CaptureFixture[str],
                                                         tmp_path: Path) -> None:
    assert run([*command, "--target", "llmapi", "--pp", "2", "--out", str(tmp_path / "o")]) == 0
    text = capsys.readouterr().out
    assert "no GPU known" in text and "weights GiB" in text and "trtllm-build" not in text
    assert "trtllm-serve command" in text and "pool set aside" not in text
