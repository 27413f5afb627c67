"""The engine target with LoRA: ``trtllm-build`` gets the LoRA plugin flags from the adapters (or from
``--lora-target-modules`` / ``--max-lora-rank``), argv asserted exactly against the fake, and the adapters are
converted to the backend's ``model.lora_weights.npy`` / ``model.lora_config.npy`` with upstream's module ids."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from fakes import FakeTrtllmBuild
from safetensors.torch import load_file

from tests.lora.adapters import make_adapter
from trtllm_kit.artifact import Artifact, LoraRecord
from trtllm_kit.artifact.integrity import artifact_changes
from trtllm_kit.artifact.machine import Machine
from trtllm_kit.cli import run
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.runtime.lora import from_rows

BASE = ("builtin:tiny-llama", "--until", "engine", "--no-verify", "--dtype", "float16", "--max-batch-size", "8",
        "--max-seq-len", "128")


def expected_argv(argv: list[str], lora: list[str]) -> list[str]:
    """The recipe's argv for tiny-llama at tp 1 on the faked H100 host, with the LoRA flags ``lora``, and the timing
    cache flags of ``argv`` (``--input_timing_cache`` once an earlier build wrote the cache)."""
    cache = argv.index("--output_timing_cache")
    timing = argv[argv.index("--log_level") + 2: cache + 2]
    return [
        "--checkpoint_dir", "checkpoint", "--output_dir", "engines",
        "--max_batch_size", "8", "--max_input_len", "64", "--max_seq_len", "128", "--max_num_tokens", "1024",
        "--max_beam_width", "1", "--logits_dtype", "float32",
        "--gpt_attention_plugin", "auto", "--gemm_plugin", "auto", "--nccl_plugin", "auto",
        "--context_fmha", "enable", "--use_paged_context_fmha", "enable", "--use_fp8_context_fmha", "disable",
        "--remove_input_padding", "enable", "--kv_cache_type", "paged", "--tokens_per_block", "32",
        "--use_fused_mlp", "enable", "--gemm_swiglu_plugin", "disable", "--low_latency_gemm_plugin", "disable",
        "--reduce_fusion", "disable", "--user_buffer", "disable", "--norm_quant_fusion", "disable",
        "--multiple_profiles", "enable", "--streamingllm", "disable", "--pp_reduce_scatter", "disable",
        *lora[:4], "--profiling_verbosity", "layer_names_only", "--workers", "1", "--log_level", "info",
        *timing, *lora[4:],
    ]


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("engine-adapters")
    return {"qv4": make_adapter(builtin_dir("tiny-llama"), root / "qv4", rank=4, targets=["q_proj", "v_proj"],
                                alpha=8, seed=1),
            "mlp8": make_adapter(builtin_dir("tiny-llama"), root / "mlp8", rank=8,
                                 targets=["gate_proj", "up_proj", "down_proj"], alpha=16, seed=2),
            "k4": make_adapter(builtin_dir("tiny-llama"), root / "k4", rank=4, targets=["k_proj"], alpha=4, seed=3)}


def test_adapters_give_the_lora_plugin_flags_and_the_backend_tensors(
        tmp_path: Path, fake_trtllm_build: FakeTrtllmBuild, gpu_host: Machine, adapters: dict[str, Path],
        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code = run(["build", *BASE, "--max-lora-rank", "8", "--lora", f"qv4={adapters['qv4']}",
                "--lora", f"mlp8={adapters['mlp8']}", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    [call] = fake_trtllm_build.calls
    assert call["argv"] == expected_argv(call["argv"], [
        "--lora_plugin", "float16", "--max_lora_rank", "8",
        "--lora_target_modules", "attn_q", "attn_v", "mlp_h_to_4h", "mlp_gate", "mlp_4h_to_h"])
    artifact = Artifact.read(out)
    assert artifact.records.lora == LoraRecord(["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"], 8, 4)
    engine_config = json.loads((out / "engines" / "config.json").read_text())
    assert engine_config["build_config"]["lora_config"]["lora_target_modules"] == [
        "attn_q", "attn_v", "mlp_h_to_4h", "mlp_gate", "mlp_4h_to_h"]
    assert artifact_changes(artifact, hashes=True) == []

    weights = np.load(out / "lora" / "mlp8" / "model.lora_weights.npy")
    config = np.load(out / "lora" / "mlp8" / "model.lora_config.npy")
    hidden, inter, layers = 256, 512, 3  # tiny-llama
    assert weights.dtype == np.float16 and config.dtype == np.int32
    assert weights.shape == (1, 3 * layers, 8 * (hidden + inter)) and config.shape == (1, 3 * layers, 3)
    assert sorted(map(tuple, config[0].tolist())) == [(m, layer, 8) for m in (5, 6, 7) for layer in range(layers)]
    checkpoint = json.loads((out / "checkpoint" / "config.json").read_text())
    pairs = from_rows(torch.from_numpy(weights[0]), torch.from_numpy(config[0]), checkpoint, torch.float16)
    peft = load_file(adapters["mlp8"] / "adapter_model.safetensors")
    prefix = "base_model.model.model.layers.1.mlp.up_proj"
    a, b = pairs[(1, "up_proj")]  # up_proj is TensorRT-LLM's mlp_gate (7)
    assert torch.equal(a, peft[f"{prefix}.lora_A.weight"].half())
    assert torch.equal(b, (peft[f"{prefix}.lora_B.weight"] * 2.0).half())  # alpha / r in B

    assert run(["lora", "add", str(out), "k4", str(adapters["k4"])]) == 2
    assert "adapts k_proj, but" in capsys.readouterr().err


def test_target_modules_and_rank_without_adapters(tmp_path: Path, fake_trtllm_build: FakeTrtllmBuild,
                                                  gpu_host: Machine, adapters: dict[str, Path],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert run(["build", *BASE, "--lora-target-modules", "attn_k,q_proj", "--max-lora-rank", "4", "--out",
                str(out)]) == 0, capsys.readouterr().err
    [call] = fake_trtllm_build.calls
    assert call["argv"] == expected_argv(call["argv"], ["--lora_plugin", "float16", "--max_lora_rank", "4",
                                                 "--lora_target_modules", "attn_q", "attn_k"])
    assert run(["lora", "add", str(out), "k4", str(adapters["k4"])]) == 0  # k_proj at rank 4: the engine takes it
    assert np.load(out / "lora" / "k4" / "model.lora_config.npy")[0, :, 0].tolist() == [2, 2, 2]  # attn_k


def test_no_lora_no_flags_and_lora_add_is_refused(tmp_path: Path, fake_trtllm_build: FakeTrtllmBuild,
                                                  gpu_host: Machine, adapters: dict[str, Path],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert run(["build", *BASE, "--out", str(out)]) == 0
    [call] = fake_trtllm_build.calls
    assert call["argv"] == expected_argv(call["argv"], [])
    capsys.readouterr()
    assert run(["lora", "add", str(out), "qv4", str(adapters["qv4"])]) == 2
    assert "built without LoRA support" in capsys.readouterr().err


@pytest.mark.parametrize(("flags", "message"), [
    (["--lora-target-modules", "c_attn"], "--lora-target-modules names 'c_attn'"),
    (["--lora-target-modules", "q_proj", "--lora", "qv4={qv4}"], "adapts v_proj, which --lora-target-modules"),
])
def test_bad_lora_settings_are_refused_before_any_work(flags: list[str], message: str, tmp_path: Path,
                                                       fake_trtllm_build: FakeTrtllmBuild, gpu_host: Machine,
                                                       adapters: dict[str, Path],
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    flags = [f.format(qv4=adapters["qv4"]) for f in flags]
    assert run(["build", *BASE, *flags, "--out", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err
    assert fake_trtllm_build.calls == [] and not (tmp_path / "out").exists()


def test_a_bfloat16_engine_gets_bfloat16_values(tmp_path: Path, fake_trtllm_build: FakeTrtllmBuild,
                                                gpu_host: Machine, adapters: dict[str, Path]) -> None:
    out = tmp_path / "out"
    base = [a if a != "float16" else "bfloat16" for a in BASE]
    assert run(["build", *base, "--lora-target-modules", "q_proj,v_proj", "--out", str(out)]) == 0
    [call] = fake_trtllm_build.calls
    assert call["argv"][call["argv"].index("--lora_plugin") + 1] == "bfloat16"
    assert run(["lora", "add", str(out), "qv4", str(adapters["qv4"])]) == 0
    weights = np.load(out / "lora" / "qv4" / "model.lora_weights.npy")
    assert weights.dtype == np.float32  # numpy has no bfloat16: float32 values that are exactly bfloat16
    stored = torch.from_numpy(weights)
    assert torch.equal(stored, stored.to(torch.bfloat16).float())
    peft = load_file(adapters["qv4"] / "adapter_model.safetensors")["base_model.model.model.layers.0.self_attn.q_proj"
                                                                    ".lora_A.weight"]
    config = np.load(out / "lora" / "qv4" / "model.lora_config.npy")[0].tolist()
    row = config.index([1, 0, 4])  # attn_q of layer 0 at rank 4
    assert torch.equal(stored[0, row, : peft.numel()], peft.to(torch.bfloat16).float().flatten())
