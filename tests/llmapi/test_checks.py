"""``trtllm-kit verify`` and ``trtllm-kit validate`` on llmapi artifacts: the unified checkpoint runs on the CPU
(at the recorded TP/PP, FP8 dequantized) against transformers with the same gates; validate reports the llmapi
repository's rules as it reports the engine target's, and exits 1 on a broken one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from trtllm_kit.cli import run


@pytest.fixture(scope="module", params=[["--tp", "2"], ["--quant", "fp8"]], ids=["tp2", "fp8"])
def out(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("checks") / "out"
    assert run(["build", "builtin:tiny-llama", "--target", "llmapi", "--no-verify", *request.param,
                "--out", str(out)]) == 0
    return out


def test_verify_runs_the_unified_checkpoint_against_transformers(out: Path, capsys: pytest.CaptureFixture) -> None:
    assert run(["verify", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"]
    fp8 = (out / "checkpoint" / "hf_quant_config.json").is_file()
    assert bool(report.get("quantization")) == fp8
    if not fp8:
        assert report["max_abs_err"] < report["tolerance"] and report["top1_agreement"] == 1.0


def test_verify_fails_a_corrupted_checkpoint(out: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "checkpoint"
    shutil.copytree(out / "checkpoint", broken)
    for file in broken.glob("*.safetensors"):
        tensors = load_file(str(file))
        name = next((n for n in tensors if n.endswith("layers.0.mlp.down_proj.weight")), None)
        if name:
            tensors[name] = tensors[name].flip(0).contiguous()
            save_file(tensors, str(file), metadata={"format": "pt"})
    assert run(["verify", str(broken), "--against", "builtin:tiny-llama"]) == 1
    assert "Error" in capsys.readouterr().err


def test_validate_reports_the_llmapi_rules(out: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert run(["validate", str(out)]) == 0
    assert "no findings" in capsys.readouterr().out
    repo = tmp_path / "repo"
    shutil.copytree(out / "repo", repo)
    path = repo / "tensorrt_llm" / "1" / "model.yaml"
    values = yaml.safe_load(path.read_text())
    values["max_batch_sise"] = values.pop("max_batch_size")
    path.write_text(yaml.safe_dump(values))
    assert run(["validate", str(repo), "--json"]) == 1
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert [(f["severity"], f["model"], f["rule"]) for f in findings] == [("error", "tensorrt_llm", "llmapi")]
    assert "max_batch_size" in findings[0]["message"]
