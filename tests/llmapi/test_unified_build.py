"""``build --target llmapi``: the unified checkpoint, the refusals, the load-time sharding on the CPU, and the
serving configuration (model.yaml, extra_llm_api_options.yaml, the trtllm-serve command)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open

from trtllm_kit.artifact import Artifact
from trtllm_kit.checkpoint.verify import verify_checkpoint
from trtllm_kit.cli import run
from trtllm_kit.errors import KitUsageError
from trtllm_kit.llmapi.llm_args import check_llm_args, render_table
from trtllm_kit.llmapi.load import load_unified
from trtllm_kit.mapping import Mapping
from trtllm_kit.model_repo.llmapi_validate import validate_llmapi_repository
from trtllm_kit.models.inspect import inspect_model

DOCS = Path(__file__).parents[2] / "docs"


def tensors(path: Path) -> dict[str, torch.Tensor]:
    out = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            out.update({name: f.get_tensor(name) for name in f.keys()})  # noqa: SIM118
    return out


@pytest.fixture(scope="module")
def llama_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("llmapi") / "out"
    assert run(["build", "builtin:tiny-llama", "--target", "llmapi", "--tp", "2", "--pp", "2", "--out", str(out)]) == 0
    return out


def test_checkpoint_is_the_hf_model_copied_tensor_for_tensor(llama_out: Path) -> None:
    source = inspect_model("builtin:tiny-llama")
    ckpt = llama_out / "checkpoint"
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    got, want = tensors(ckpt), tensors(source.path)
    assert set(index["weight_map"]) == set(got) == set(want)
    assert all(got[name].dtype == want[name].dtype and torch.equal(got[name], want[name]) for name in want)
    config = json.loads((ckpt / "config.json").read_text())
    assert {k: v for k, v in config.items()} == source.hf.raw
    assert not (ckpt / "hf_quant_config.json").exists()
    assert {"generation_config.json", "tokenizer.json", "tokenizer_config.json"} <= {p.name for p in ckpt.iterdir()}


def test_manifest_records_the_serving_layout_and_the_trtllm_serve_command(llama_out: Path) -> None:
    artifact = Artifact.read(llama_out)
    assert artifact.target == "llmapi"
    assert (artifact.layout.tp_size, artifact.layout.pp_size) == (2, 2)
    assert artifact.records.checkpoint.tp_size == 2 and artifact.records.verify["passed"]
    options = llama_out / "trtllm-serve" / "extra_llm_api_options.yaml"
    assert artifact.records.engine.command == [
        "trtllm-serve", str(llama_out.absolute() / "checkpoint"), "--host", "127.0.0.1", "--port", "8000",
        "--backend", "pytorch", "--extra_llm_api_options", str(options.absolute())]
    values = yaml.safe_load(options.read_text())
    assert values["tensor_parallel_size"] == 2 and values["pipeline_parallel_size"] == 2
    assert values["cuda_graph_config"] == {"enable_padding": True, "max_batch_size": values["max_batch_size"]}
    model_yaml = yaml.safe_load((llama_out / "repo" / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert model_yaml["triton_config"] == {"max_batch_size": 0, "decoupled": True, "cancellation_check_period_ms": 100}
    assert {k: v for k, v in model_yaml.items() if k not in ("model", "triton_config")} == values
    assert validate_llmapi_repository(llama_out / "repo") == []


@pytest.mark.parametrize("tp, pp", [(1, 1), (2, 1), (1, 2), (4, 1)])
def test_load_time_sharding_matches_transformers(tp: int, pp: int, llama_out: Path) -> None:
    ckpt = llama_out / "checkpoint"
    report = verify_checkpoint(ckpt, inspect_model("builtin:tiny-llama").path,
                               load=lambda dtype: load_unified(ckpt, Mapping(tp, pp), dtype))
    assert report.passed and report.max_abs_err < 1e-4, report


@pytest.mark.parametrize("flags, sentence", [
    (["--quant", "int8-sq"], "--quant int8-sq is refused for --target llmapi because TensorRT-LLM's PyTorch backend "
                             "has no W8A8 INT8 (SmoothQuant) linear method; use --quant fp8"),
    (["--quant", "int8-wo"], "--quant int8-wo is refused for --target llmapi"),
    (["--kv-cache", "int8"], "--kv-cache int8 is refused for --target llmapi"),
    (["--tp", "3"], "tp"),
])
def test_refusals(flags: list[str], sentence: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = run(["build", "builtin:tiny-llama", "--target", "llmapi", *flags, "--out", str(tmp_path / "out")])
    assert code == 2
    assert sentence in capsys.readouterr().err.replace("\n", " ")
    assert not (tmp_path / "out").exists()


def test_llm_args_typo_is_refused_with_the_nearest_key() -> None:
    with pytest.raises(KitUsageError, match=r"kv_cache_config.free_gpu_mem_fraction is not a TensorRT-LLM 1.2 "
                       r"TorchLlmArgs field .* did you mean kv_cache_config.free_gpu_memory_fraction"):
        check_llm_args({"kv_cache_config": {"free_gpu_mem_fraction": 0.9}})
    with pytest.raises(KitUsageError, match="did you mean max_batch_size"):
        check_llm_args({"max_batch_sizes": 8})
    with pytest.raises(KitUsageError, match="did you mean triton_config"):
        check_llm_args({"triton_configs": {}}, triton=True)
    with pytest.raises(KitUsageError, match="capacity_scheduler_policy is 'FCFS'"):
        check_llm_args({"scheduler_config": {"capacity_scheduler_policy": "FCFS"}})


def test_field_table_in_docs_is_the_one_the_kit_checks_against() -> None:
    assert (DOCS / "llmapi-llm-args.md").read_text() == render_table()


def test_a_phi3_fp8_checkpoint_runs_with_its_fused_parts_read_by_rows(tmp_path: Path) -> None:
    """Phi-3's fused qkv_proj and gate_up_proj are one FP8 linear each: the loader cuts q/k/v and gate/up out of
    them by rows, one scale per fused tensor, and the build's verify runs the result against transformers."""
    out = tmp_path / "out"
    assert run(["build", "builtin:tiny-phi3", "--target", "llmapi", "--quant", "fp8", "--calib-samples", "4",
                "--calib-seq-len", "32", "--until", "checkpoint", "--out", str(out)]) == 0
    qkv = load_unified(out / "checkpoint").ranks[0]["transformer.layers.0.attention.qkv.weight"]
    hf = inspect_model("builtin:tiny-phi3").hf
    assert qkv.shape[0] == (hf.num_attention_heads + 2 * hf.num_key_value_heads) * hf.head_dim
