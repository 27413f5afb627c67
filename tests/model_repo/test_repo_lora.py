"""The LoRA inputs and cache parameters of generated repositories: an engine built with the LoRA plugin (a fake
engine directory: no GPU here) gets them with its dtype and rank, one without gets none; the ensemble and BLS pass
the inputs on and the repository validates; the CPU runtime's cache holds what its host memory fits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from repo_material import write_engine_dir
from tritonclient.grpc import model_config_pb2 as mc

from trtllm_kit.errors import KitUsageError
from trtllm_kit.model_repo.configs import parse_config
from trtllm_kit.model_repo.lora import LoraServing
from trtllm_kit.model_repo.repository import write_repository
from trtllm_kit.model_repo.validate import validate_repository
from trtllm_kit.runtime.lora import cache_capacity
from trtllm_kit.runtime.lora_modules import module_shapes
from trtllm_kit.spec import build_spec
from trtllm_kit.spec.repo_options import RepoOptions
from trtllm_kit.targets import get_target, limits_from_dir

LORA = ("lora_task_id", "lora_weights", "lora_config")


def spec(tmp_path: Path):
    return build_spec({}, {"model": "builtin:tiny-llama", "out": tmp_path / "out"})


def test_an_engine_with_the_lora_plugin_declares_the_inputs_in_its_dtype(tmp_path: Path,
                                                                         tokenizer_files: list[Path]) -> None:
    engine_dir = write_engine_dir(tmp_path / "engines", max_lora_rank=8)
    target = get_target("engine")
    lora = target.lora_serving(engine_dir, spec(tmp_path))
    assert lora == LoraServing(max_lora_rank=8, weights_type="BF16")
    options = RepoOptions(lora_cache_host_memory_bytes=1 << 28, lora_cache_gpu_memory_fraction=0.1)
    write_repository(tmp_path / "repo", target.limits(engine_dir, {}), options, model_path=engine_dir,
                     tokenizer_files=tokenizer_files, lora=lora)
    configs = {name: parse_config((tmp_path / "repo" / name / "config.pbtxt").read_text())
               for name in ("tensorrt_llm", "ensemble", "tensorrt_llm_bls")}
    trt = {t.name: t for t in configs["tensorrt_llm"].input}
    assert trt["lora_weights"].data_type == mc.TYPE_BF16 and trt["lora_weights"].allow_ragged_batch
    assert list(trt["lora_task_id"].reshape.shape) == [] and trt["lora_task_id"].HasField("reshape")
    assert all(set(LORA) <= {t.name for t in c.input} for c in configs.values())
    params = {k: v.string_value for k, v in configs["tensorrt_llm"].parameters.items() if k.startswith("lora_")}
    assert params == {"lora_cache_optimal_adapter_size": "8", "lora_cache_max_adapter_size": "8",
                      "lora_cache_gpu_memory_fraction": "0.1", "lora_cache_host_memory_bytes": str(1 << 28)}
    report = validate_repository(tmp_path / "repo", read_limits=limits_from_dir, model_dir=engine_dir)
    assert not report.errors


def test_an_engine_without_the_plugin_takes_no_adapters(tmp_path: Path) -> None:
    engine_dir = write_engine_dir(tmp_path / "engines")
    assert get_target("engine").lora_serving(engine_dir, spec(tmp_path)) is None


def test_the_cpu_cache_holds_what_fits_and_refuses_less_than_one(tiny_checkpoint: Path, tmp_path: Path) -> None:
    config = json.loads((tiny_checkpoint / "config.json").read_text())
    assert config["dtype"] == "bfloat16"
    assert get_target("cpu").lora_serving(tiny_checkpoint, spec(tmp_path)) == LoraServing(64, "BF16")
    per_layer = sum(fan_in + fan_out for fan_in, fan_out in module_shapes(config).values())
    one = 16 * per_layer * int(config["num_hidden_layers"]) * 2  # rank 16 on every module, 2 bytes per value
    assert [cache_capacity(config, 16, n) for n in (one, 3 * one + one - 1)] == [1, 3]
    with pytest.raises(KitUsageError, match="Not enough space allocated to host LoRA cache to hold 1 max sized LoRA"):
        cache_capacity(config, 16, one - 1)
