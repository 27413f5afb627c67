"""An adapter whose ``adapter_config.json`` records another base model is refused even when its shapes fit, and taken
with ``--force``; the same model under a hub id, a local directory, a hub-cache snapshot or the built-in name is
the same model."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.lora.adapters import make_adapter
from tests.lora.hostile import with_config
from trtllm_kit.artifact import Artifact
from trtllm_kit.cli import run
from trtllm_kit.models.builtin import builtin_dir

NAMES = [  # what a model source or directory says → the name compared
    ("builtin:tiny-llama", "tiny-llama"),
    ("meta-llama/Llama-3.1-8B", "llama-3.1-8b"),
    ("/models/Llama-3.1-8B/", "llama-3.1-8b"),
    ("./Llama-3.1-8B", "llama-3.1-8b"),
    ("/root/.cache/huggingface/hub/models--meta-llama--Llama-3.1-8B/snapshots/0123abcd", "llama-3.1-8b"),
    ("/root/.cache/huggingface/hub/models--meta-llama--Llama-3.1-8B", "llama-3.1-8b"),
    ("/home/u/.cache/trtllm-kit/builtin/tiny-llama-5f3a9c1e", "tiny-llama"),
    ("C:\\models\\Llama-3.1-8B-Instruct", "llama-3.1-8b-instruct"),
]


@pytest.mark.parametrize(("text", "name"), NAMES)
def test_model_names(text: str, name: str) -> None:
    from trtllm_kit.lora.base_model import model_name

    assert model_name(text) == name


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("base") / "out"
    assert run(["build", "builtin:tiny-llama", "--target", "cpu", "--dtype", "float32", "--no-verify",
                "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_adapter(builtin_dir("tiny-llama"), tmp_path_factory.mktemp("good") / "r4", rank=4,
                        targets=["q_proj", "v_proj"], alpha=8, seed=1)


def test_an_adapter_of_another_base_is_refused_unless_forced(artifact: Path, good: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    other = with_config(good, tmp_path / "other", base_model_name_or_path="meta-llama/Llama-3.1-8B")
    capsys.readouterr()
    assert run(["lora", "add", str(artifact), "other", str(other)]) == 2
    err = capsys.readouterr().err
    assert ("records base_model_name_or_path 'meta-llama/Llama-3.1-8B', but" in err
            and "is built from 'builtin:tiny-llama'" in err and "--force" in err and err.count("\n") == 1), err
    assert "other" not in Artifact.read(artifact).records.adapters
    assert run(["lora", "add", str(artifact), "other", str(other), "--force"]) == 0
    assert "other" in Artifact.read(artifact).records.adapters
    # the same base, spelled otherwise, or not recorded at all
    for number, recorded in enumerate(["someone/tiny-llama", "/elsewhere/TINY-LLAMA/", None]):
        source = with_config(good, tmp_path / f"same{number}", base_model_name_or_path=recorded)
        assert run(["lora", "add", str(artifact), f"same{number}", str(source)]) == 0, recorded
