"""The unified export's fast paths: an unchanged shard is the input file byte for byte, the FP8 kernel gives the
same bytes on several threads as ModelOpt's one-line arithmetic, and NaN weights are still refused where the
export computes new values (FP8, a dtype conversion)."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from trtllm_kit.errors import CheckpointError
from trtllm_kit.llmapi.quant_format import quantize_weight, weight_scale
from trtllm_kit.llmapi.unified import write_unified
from trtllm_kit.models.inspect import inspect_model
from trtllm_kit.quant.algos import QuantConfig
from trtllm_kit.quant.calibrate import CalibrationStats


def modelopt_arithmetic(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """ModelOpt's FP8 weight export as one expression (``to_quantized_weight``): W / scale in W's dtype, cast."""
    return (weight / scale).to(torch.float8_e4m3fn)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_fp8_kernel_on_threads_gives_modelopt_bytes(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(7)
    weight = (torch.randn(1536, 1024, generator=generator) * 0.03).to(dtype)
    weight[3, :6] = torch.tensor([0.0, -0.0, 1e-7, -1e-7, 2e-5, -3e-4]).to(dtype)
    scale = weight_scale(weight.float().abs().max())
    want = modelopt_arithmetic(weight, scale).view(torch.uint8)
    with ThreadPoolExecutor(2) as pool:
        threaded, finite = quantize_weight(weight, scale, pool, 2)
    alone, _ = quantize_weight(weight, scale)
    assert finite
    assert torch.equal(threaded.view(torch.uint8), want)
    assert torch.equal(alone.view(torch.uint8), want)


def test_fp8_kernel_reports_a_non_finite_block() -> None:
    weight = torch.ones(2048, 512, dtype=torch.bfloat16)
    weight[1700, 5] = float("nan")
    with ThreadPoolExecutor(2) as pool:
        _, finite = quantize_weight(weight, torch.tensor(1 / 448), pool, 2)
    assert not finite


@pytest.fixture
def hf_copy(tmp_path: Path) -> Path:
    source = inspect_model("builtin:tiny-llama").path
    copy = tmp_path / "hf"
    shutil.copytree(source, copy)
    return copy


def test_unchanged_shards_are_the_input_files(hf_copy: Path, tmp_path: Path) -> None:
    out = tmp_path / "ckpt"
    out.mkdir()
    model = inspect_model(str(hf_copy))
    result = write_unified(model, out)
    assert len(result.files) == len(model.weight_files)
    for written, source in zip(result.files, model.weight_files, strict=True):
        assert written.read_bytes() == source.read_bytes()
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(model.tensors)


def poison(hf_dir: Path, name: str) -> None:
    """Put a NaN into tensor ``name`` of the (single-file) checkpoint ``hf_dir``."""
    [path] = sorted(hf_dir.glob("*.safetensors"))
    tensors = load_file(str(path))
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[11] = float("nan")
    save_file(tensors, str(path), metadata={"format": "pt"})


def test_nan_weight_is_refused_by_fp8_export(hf_copy: Path, tmp_path: Path) -> None:
    name = "model.layers.0.mlp.down_proj.weight"
    poison(hf_copy, name)
    model = inspect_model(str(hf_copy))
    stats = CalibrationStats()
    for module in (n.removesuffix(".weight") for n in model.tensors if n.endswith("_proj.weight")):
        stats.w[module] = torch.ones(1)  # a stale scale: the NaN must be found in the quantization pass itself
        stats.x[module] = torch.ones(1)
    out = tmp_path / "ckpt"
    out.mkdir()
    with pytest.raises(CheckpointError, match=f"HF tensor {name} holds 1 NaN"):
        write_unified(model, out, quant=QuantConfig(quant="fp8"), stats=stats)


def test_nan_weight_is_refused_when_the_dtype_changes(hf_copy: Path, tmp_path: Path) -> None:
    name = "model.layers.1.self_attn.o_proj.weight"
    poison(hf_copy, name)
    out = tmp_path / "ckpt"
    out.mkdir()
    with pytest.raises(CheckpointError, match=f"HF tensor {name} holds 1 NaN"):
        write_unified(inspect_model(str(hf_copy)), out, "float16")


def test_cpu_llm_raises_a_request_the_runtime_refuses(tmp_path: Path) -> None:
    import asyncio

    from trtllm_kit.llmapi.cpu_llm import LLM, RequestError, SamplingParams

    out = tmp_path / "ckpt"
    out.mkdir()
    write_unified(inspect_model("builtin:tiny-llama"), out)
    llm = LLM(model=str(out), max_seq_len=64)

    async def generate(ids: list[int]) -> list[int]:
        return (await llm.generate_async(ids, SamplingParams(max_tokens=4, ignore_eos=True)).aresult()).outputs[0] \
            .token_ids

    try:
        with pytest.raises(RequestError):
            asyncio.run(generate([1] * 100))  # longer than max_seq_len: refused, raised where it is awaited
        assert len(asyncio.run(generate([1, 415, 565]))) == 4  # the runtime goes on serving
    finally:
        llm.shutdown()


def test_cpu_llm_refuses_hostile_sampling_while_a_neighbour_streams(tmp_path: Path) -> None:
    import asyncio

    from trtllm_kit.errors import KitUsageError
    from trtllm_kit.llmapi.cpu_llm import LLM, SamplingParams

    out = tmp_path / "ckpt"
    out.mkdir()
    write_unified(inspect_model("builtin:tiny-llama"), out)
    llm = LLM(model=str(out), max_seq_len=256)

    async def scenario() -> tuple[list[int], list[int], list[int]]:
        neighbour = llm.generate_async([1, 415, 565], SamplingParams(max_tokens=40, ignore_eos=True), streaming=True)
        greedy = llm.generate_async([1, 415, 565], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
        tiny = llm.generate_async([1, 415, 565], SamplingParams(max_tokens=6, temperature=1e-45, ignore_eos=True,
                                                                seed=2**64 - 1))
        for hostile in (SamplingParams(temperature=float("nan")), SamplingParams(seed=2**64),
                        SamplingParams(top_p=1.5)):
            with pytest.raises(KitUsageError):
                llm.generate_async([1, 415, 565], hostile)
        streamed = [output.outputs[0].token_ids async for output in neighbour][-1]
        return streamed, (await greedy.aresult()).outputs[0].token_ids, (await tiny.aresult()).outputs[0].token_ids

    try:
        streamed, greedy, tiny = asyncio.run(asyncio.wait_for(scenario(), 300))
        assert len(streamed) == 40 and tiny == greedy  # below 1e-5 the temperature is greedy
    finally:
        llm.shutdown()
