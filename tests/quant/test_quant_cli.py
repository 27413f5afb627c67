"""``trtllm-kit build``/``inspect`` with quantization: exit codes, exact ``Error:`` sentences, the artifact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from trtllm_kit.cli import run

torch.set_num_threads(1)
FP8_INT8 = ("--quant fp8 cannot be combined with --kv-cache int8; with --quant fp8 use --kv-cache auto or fp8, or use "
            "--kv-cache int8 with --quant none, int8-wo, int8-sq or int4-awq.")
WO_FP8 = ("--quant int8-wo cannot be combined with --kv-cache fp8; with --quant int8-wo use --kv-cache auto or int8, "
          "or use --kv-cache fp8 with --quant none, fp8, nvfp4 or int4-awq.")
SQ_FP8 = ("--quant int8-sq cannot be combined with --kv-cache fp8; with --quant int8-sq use --kv-cache auto or int8, "
          "or use --kv-cache fp8 with --quant none, fp8, nvfp4 or int4-awq.")
SQ_TP4 = ("--quant int8-sq needs at least as many KV heads as --tp (the SmoothQuant plugin path cannot duplicate KV "
          "heads), but the model has 2 KV head(s) and tp is 4; use --tp 2 or less, or --quant int8-wo or fp8.")


def errors(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("Error:")]


@pytest.mark.parametrize(("flags", "message"), [
    ("--quant fp8 --kv-cache int8", FP8_INT8),
    ("--quant int8-wo --kv-cache fp8", WO_FP8),
    ("--quant int8-sq --kv-cache fp8", SQ_FP8),
    ("--quant int8-sq --tp 4", SQ_TP4),
    ("--quant fp8 --per-token", "--per-channel and --per-token apply to --quant int8-sq only, not --quant fp8."),
    ("--quant int8-sq --smoothquant-alpha 1.5", "--smoothquant-alpha must be a number in [0, 1], got 1.5."),
    ("--kv-cache int8 --calib-samples 0", "--calib-samples must be a positive integer, got 0."),
])
@pytest.mark.parametrize("command", ["build", "inspect"])
def test_invalid_quantization_exits_2_with_the_exact_message(command: str, flags: str, message: str,
                                                             tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = ["--out", str(tmp_path / "out")] if command == "build" else []
    assert run([command, "builtin:tiny-llama", *flags.split(), *out]) == 2
    assert errors(capsys) == [f"Error: {message}"]
    assert not (tmp_path / "out").exists()


def test_empty_calibration_data_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "empty.txt"
    data.write_text("\n")
    code = run(["build", "builtin:tiny-llama", "--until", "checkpoint", "--kv-cache", "int8", "--calib-data",
                str(data), "--out", str(tmp_path / "out")])
    assert code == 2
    assert errors(capsys) == [f"Error: --calib-data {data} holds no text; calibration needs at least one "
                              "non-empty line."]
    assert not (tmp_path / "out").exists()


def test_toml_quant_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "trtllm-kit.toml"
    config.write_text('model = "builtin:tiny-llama"\n[quant]\nquant = "fp8"\nkv_cache = "int8"\n')
    assert run(["build", "--config", str(config), "--out", str(tmp_path / "out")]) == 2
    assert errors(capsys) == [f"Error: {FP8_INT8}"]


def test_build_fp8_with_fp8_kv_cache_at_tp2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code = run(["build", "builtin:tiny-qwen2", "--until", "checkpoint", "--quant", "fp8", "--kv-cache", "fp8",
                "--tp", "2", "--calib-samples", "8", "--calib-seq-len", "64", "--out", str(out), "--json"])
    assert code == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out)
    assert summary["checkpoint"]["quantization"]["quant_algo"] == "FP8"
    assert summary["calibration"]["calib_samples"] == 8 and summary["calibration"]["num_tokens"] == 8 * 64
    assert summary["verify"]["quantization"] == "FP8/FP8" and summary["verify"]["passed"]
    config = json.loads((out / "checkpoint" / "config.json").read_text())
    assert config["quantization"]["exclude_modules"] == ["lm_head"]
    assert sorted(p.name for p in (out / "calibration").iterdir()) == ["calibration.json", "stats.safetensors"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert "calibration/stats.safetensors" in manifest["outputs"]
    assert manifest["spec"]["quant"]["quant"] == "fp8" and manifest["spec"]["quant"]["kv_cache"] == "fp8"
    rank1 = load_file(out / "checkpoint" / "rank1.safetensors")
    assert rank1["transformer.layers.0.attention.qkv.weight"].dtype == torch.float8_e4m3fn
    assert rank1["lm_head.weight"].dtype == torch.bfloat16


def test_build_w8a16_writes_model_dtype_weights_and_no_calibration(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert run(["build", "builtin:tiny-llama", "--until", "checkpoint", "--quant", "int8-wo", "--out", str(out),
                "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert "calibration" not in summary and not (out / "calibration").exists()
    assert summary["verify"]["quantization"] == "W8A16/None"
    rank0 = load_file(out / "checkpoint" / "rank0.safetensors")
    assert {t.dtype for t in rank0.values()} == {torch.bfloat16}


def test_inspect_shows_the_quantized_layout(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["inspect", "builtin:tiny-llama", "--tp", "2", "--quant", "int8-sq", "--per-channel", "--json"]) == 0
    build = json.loads(capsys.readouterr().out)["build"]
    assert build["quantization"]["quant_algo"] == "W8A8_SQ_PER_CHANNEL_PER_TENSOR_PLUGIN"
    assert build["needs_calibration"] is True
    # per rank: 3 layers × (2 norms + 2 scale_to_int + 5 weights + 5 per_channel_scale + 5 act_scale
    # + 2 smoothers + 2 quantization_scaling_factor) + embedding + ln_f + lm_head
    assert [r["num_tensors"] for r in build["ranks"]] == [3 * 23 + 3, 3 * 23 + 3]


def test_a_rebuild_reuses_the_calibration_with_the_checkpoint(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["build", "builtin:tiny-mistral", "--until", "checkpoint", "--kv-cache", "fp8", "--calib-samples", "4",
            "--calib-seq-len", "32", "--no-verify", "--out", str(tmp_path / "out"), "--json"]
    assert run(argv) == 0
    first = json.loads(capsys.readouterr().out)
    stats = (tmp_path / "out" / "calibration" / "stats.safetensors").read_bytes()
    assert run(argv) == 0
    second = json.loads(capsys.readouterr().out)
    assert second["reused"] == ["checkpoint"] and second["calibration"] == first["calibration"]
    assert (tmp_path / "out" / "calibration" / "stats.safetensors").read_bytes() == stats
    assert run([*argv[:-4], "--calib-seed", "7", *argv[-4:]]) == 0  # other calibration: calibrated again
    assert json.loads(capsys.readouterr().out)["reused"] == []


def test_verify_of_a_broken_quantized_checkpoint_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert run(["build", "builtin:tiny-llama", "--until", "checkpoint", "--quant", "fp8", "--calib-samples", "8",
                "--calib-seq-len", "64", "--no-verify", "--out", str(out)]) == 0
    assert run(["verify", str(out), "--against", "builtin:tiny-llama"]) == 0
    captured = capsys.readouterr()
    assert "(quantized, float32)" in captured.out and "FP8/None: perplexity" in captured.out
    rank = load_file(out / "checkpoint" / "rank0.safetensors")
    for layer in range(3):
        rank[f"transformer.layers.{layer}.attention.qkv.activation_scaling_factor"] /= 10
    save_file(rank, str(out / "checkpoint" / "rank0.safetensors"))
    assert run(["verify", str(out), "--against", "builtin:tiny-llama"]) == 1
    (line,) = errors(capsys)
    assert line.startswith("Error: the quantized checkpoint strays too far from the unquantized model: FP8/None: "
                           "perplexity ")
    assert line.endswith("calibrate on more or other data (--calib-data, --calib-samples), choose another --quant, "
                         "or build with --no-verify to ship it as measured.")
