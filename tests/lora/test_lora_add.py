"""``lora add|list|remove``: PEFT adapters checked against the base, converted with the scale in B, recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.lora.adapters import make_adapter
from trtllm_kit.artifact import Artifact
from trtllm_kit.artifact.integrity import artifact_changes
from trtllm_kit.cli import run
from trtllm_kit.models.builtin import builtin_dir


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("lora") / "out"
    assert run(["build", "builtin:tiny-llama", "--target", "cpu", "--dtype", "float32", "--no-verify",
                "--max-lora-rank", "16", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_adapter(builtin_dir("tiny-llama"), tmp_path_factory.mktemp("a") / "r4", rank=4,
                        targets=["q_proj", "v_proj", "down_proj"], alpha=8, seed=1)


def test_add_converts_records_and_keeps_the_artifact_whole(artifact: Path, adapter: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["lora", "add", str(artifact), "support", str(adapter)]) == 0
    record = Artifact.read(artifact).records.adapters["support"]
    assert (record.rank, record.alpha, record.target_modules) == (4, 8.0, ["down_proj", "q_proj", "v_proj"])
    converted = load_file(artifact / record.dir / "adapter.safetensors")
    peft = load_file(adapter / "adapter_model.safetensors")
    prefix = "base_model.model.model.layers.1.self_attn.q_proj"
    assert torch.equal(converted["layers.1.q_proj.lora_A"], peft[f"{prefix}.lora_A.weight"])
    assert torch.equal(converted["layers.1.q_proj.lora_B"], peft[f"{prefix}.lora_B.weight"] * 2.0)  # alpha / r
    assert artifact_changes(Artifact.read(artifact), hashes=True) == []
    capsys.readouterr()
    assert run(["lora", "list", str(artifact), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [a["name"] for a in listed] == ["support"] and len(listed[0]["sha256"]) == 64
    assert run(["lora", "add", str(artifact), "support", str(adapter)]) == 2
    assert run(["lora", "remove", str(artifact), "support"]) == 0
    assert Artifact.read(artifact).records.adapters == {}
    assert not (artifact / "lora" / "support").exists()
    assert artifact_changes(Artifact.read(artifact), hashes=True) == []
    assert run(["lora", "remove", str(artifact), "support"]) == 2


def _edit_config(src: Path, dst: Path, **changes: object) -> Path:
    dst.mkdir()
    config = json.loads((src / "adapter_config.json").read_text())
    (dst / "adapter_config.json").write_text(json.dumps({**config, **changes}))
    (dst / "adapter_model.safetensors").write_bytes((src / "adapter_model.safetensors").read_bytes())
    return dst


def test_wrong_adapters_are_refused_in_one_sentence(artifact: Path, adapter: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    over = make_adapter(builtin_dir("tiny-llama"), tmp_path / "r32", rank=32, targets=["q_proj"], alpha=32, seed=2)
    phi3 = make_adapter(builtin_dir("tiny-phi3"), tmp_path / "phi3", rank=4, targets=["qkv_proj"], alpha=8, seed=3)
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "adapter_config.json").write_text((adapter / "adapter_config.json").read_text())
    (pickled / "adapter_model.bin").write_bytes(b"not loaded")
    saves = _edit_config(adapter, tmp_path / "saves", modules_to_save=["lm_head"])
    half = tmp_path / "half"
    half.mkdir()
    (half / "adapter_config.json").write_text((adapter / "adapter_config.json").read_text())
    tensors = load_file(adapter / "adapter_model.safetensors")
    save_file({k: v.to(torch.int32) for k, v in tensors.items()}, half / "adapter_model.safetensors")
    cases = [(over, "rank 32, above the artifact's max_lora_rank 16"), (phi3, "targets qkv_proj"),
             (pickled, "a pickle"), (saves, "modules_to_save"), (half, "must be float16, bfloat16 or float32")]
    for path, words in cases:
        capsys.readouterr()
        assert run(["lora", "add", str(artifact), "bad", str(path)]) == 2, path
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 1, err
    assert Artifact.read(artifact).records.adapters == {}
    assert not (artifact / "lora" / "bad").exists()


def test_build_adds_adapters_inside_the_build(adapter: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert run(["build", "builtin:tiny-llama", "--target", "cpu", "--dtype", "float32", "--no-verify",
                "--lora", f"support={adapter}", "--lora", f"billing={adapter}", "--out", str(out)]) == 0
    built = Artifact.read(out)
    assert sorted(built.records.adapters) == ["billing", "support"]
    assert built.spec.build.lora == {"support": str(adapter), "billing": str(adapter)}
    assert artifact_changes(built, hashes=True) == []
    capsys.readouterr()
    assert run(["build", "builtin:tiny-llama", "--target", "cpu", "--dtype", "float32", "--no-verify",
                "--max-lora-rank", "8", "--lora", f"support={adapter}", "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert "checkpoint" in summary["reused"] and list(summary["adapters"]) == ["support"]  # adapters: no rebuild
    assert run(["build", "builtin:tiny-llama", "--target", "cpu", "--no-verify", "--lora", "nodir",
                "--out", str(tmp_path / "other")]) == 2
