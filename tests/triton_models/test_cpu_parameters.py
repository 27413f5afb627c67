"""cpu_parameters: a CPU tensorrt_llm model configuration read as initialize reads it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from trtllm_kit.errors import KitUsageError
from trtllm_kit.runtime.threads import StepThreads
from trtllm_kit.triton_models.cpu_parameters import CpuParameters, cpu_threads

REPO = Path("/models/tensorrt_llm")


def _config(**parameters: str) -> dict:
    return {"max_batch_size": 4, "dynamic_batching": {"default_queue_policy": {"max_queue_size": 7}},
            "model_transaction_policy": {"decoupled": True},
            "parameters": {k: {"string_value": v} for k, v in parameters.items()}}


def test_parameters_take_the_batch_size_and_queue_policy_and_resolve_paths() -> None:
    read = CpuParameters.from_config(_config(gpt_model_path="ckpt", xgrammar_tokenizer_info_path="info.json",
                                             exclude_input_in_output="True"), REPO)
    assert (read.values["max_batch_size"], read.values["max_queue_size"]) == ("4", "7")
    assert (read.checkpoint, read.tokenizer_info) == (REPO / "ckpt", REPO / "info.json")
    assert read.is_decoupled and read.exclude_input
    assert CpuParameters.from_config(_config(gpt_model_path="/abs/ckpt"), REPO).checkpoint == Path("/abs/ckpt")


def test_set_parameters_win_and_template_paths_mean_none() -> None:
    read = CpuParameters.from_config(_config(gpt_model_path="c", max_queue_size="2",
                                             xgrammar_tokenizer_info_path="${xgrammar_tokenizer_info_path}"), REPO)
    assert (read.values["max_queue_size"], read.tokenizer_info, read.exclude_input) == ("2", None, False)


def test_a_missing_checkpoint_is_refused() -> None:
    with pytest.raises(KitUsageError, match="no gpt_model_path parameter; set it to the TensorRT-LLM checkpoint"):
        CpuParameters.from_config(_config(), REPO)


@pytest.mark.parametrize("parameters, size", [
    ({"lora_cache_host_memory_bytes": "1000", "lora_cache_max_adapter_size": "8"}, (8, 1000)),
    ({"lora_cache_host_memory_bytes": "1000", "lora_cache_max_adapter_size": "8", "lora_cache_max_adapters": "3"},
     None),
    ({"lora_cache_max_adapter_size": "8"}, None),
])
def test_the_lora_cache_is_sized_in_bytes_only_without_an_adapter_count(parameters: dict, size: tuple | None) -> None:
    assert CpuParameters.from_config(_config(gpt_model_path="c", **parameters), REPO).lora_cache_size() == size


@pytest.mark.parametrize("value, threads", [("3", 3), ("", None), ("${cpu_threads}", None)])
def test_cpu_threads_are_the_parameter_else_omp_num_threads(value: str, threads: int | None) -> None:
    assert os.environ["OMP_NUM_THREADS"] == "1"  # tests/conftest.py; torch's count follows it
    expected = StepThreads.fixed(torch.get_num_threads() if threads is None else threads)
    assert CpuParameters.from_config(_config(gpt_model_path="c", cpu_threads=value), REPO).cpu_threads == expected


@pytest.mark.parametrize("cores, threads", [(1, 1), (2, 1), (16, 15)])
def test_unset_threads_are_the_runtimes_default(cores: int, threads: int) -> None:
    previous = torch.get_num_threads()
    torch.set_num_threads(cores)  # torch's count without OMP_NUM_THREADS: the machine's physical cores
    try:
        assert cpu_threads("", environ={}) == StepThreads(threads, cores)
        assert cpu_threads("", environ={"OMP_NUM_THREADS": str(cores)}) == StepThreads.fixed(cores)  # as set
        assert cpu_threads("4", environ={}) == StepThreads.fixed(4)  # the parameter: every step
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_cpu_threads_below_one_or_not_a_number_are_refused(value: str) -> None:
    with pytest.raises(KitUsageError, match=f"parameter cpu_threads is '{value}'; set it to a whole number"):
        CpuParameters.from_config(_config(gpt_model_path="c", cpu_threads=value), REPO)
