"""``build --target llmapi --speculative draft-target``: the draft is copied into the artifact (``draft/``) and
``speculative_model_dir`` names that copy, so the artifact serves without the directory it was built from; a changed
draft is copied again."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
import yaml

from trtllm_kit.cli import run
from trtllm_kit.llmapi.cpu_llm import LLM, SamplingParams
from trtllm_kit.models.builtin import builtin_dir

PROMPT = [1, 415, 565, 37, 902, 11, 415, 565, 37, 902, 11, 415]


def build_args(draft: Path, out: Path) -> list[str]:
    return ["builtin:tiny-llama", "--out", str(out), "--target", "llmapi", "--no-verify", "--speculative",
            "draft-target", "--draft-model", str(draft), "--max-draft-len", "3"]


@pytest.fixture
def draft(tmp_path: Path) -> Path:
    """A draft directory as users have them: the model's files, a hidden file and a subdirectory."""
    path = tmp_path / "draft-src"
    shutil.copytree(builtin_dir("tiny-llama"), path)
    (path / ".cache").mkdir()
    (path / ".cache" / "lock").write_text("x")
    (path / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    return path


def test_the_draft_is_copied_and_named_inside_the_artifact(draft: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run(["build", *build_args(draft, out)]) == 0
    copied = sorted(p.name for p in (out / "draft").iterdir())
    assert copied == sorted(p.name for p in draft.iterdir() if p.is_file() and not p.name.startswith("."))
    assert "config.json" in copied and any(name.endswith(".safetensors") for name in copied)
    for name in copied:
        assert (out / "draft" / name).read_bytes() == (draft / name).read_bytes(), name
    for path in (out / "repo" / "tensorrt_llm" / "1" / "model.yaml", out / "trtllm-serve" /
                 "extra_llm_api_options.yaml"):
        assert yaml.safe_load(path.read_text())["speculative_config"]["speculative_model_dir"] == str(
            out.absolute() / "draft"), path
    summary = json.loads((out / "manifest.json").read_text())["summary"]
    assert summary["draft"] == {"dir": "draft", "source": str(draft),
                                "bytes": sum((draft / name).stat().st_size for name in copied)}
    outputs = json.loads((out / "manifest.json").read_text())["outputs"]
    assert {f"draft/{name}" for name in copied} <= set(outputs)


def test_the_artifact_serves_without_the_draft_it_was_built_from(draft: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run(["build", *build_args(draft, out)]) == 0
    shutil.rmtree(draft)
    values = yaml.safe_load((out / "repo" / "tensorrt_llm" / "1" / "model.yaml").read_text())
    llm_args = {k: v for k, v in values.items() if k != "triton_config"}
    llm = LLM(**llm_args)

    async def generate() -> list[int]:
        result = await llm.generate_async(PROMPT, SamplingParams(max_tokens=8, temperature=0.0)).aresult()
        return list(result.outputs[0].token_ids)
    try:
        assert len(asyncio.run(generate())) == 8
    finally:
        llm.shutdown()


def test_a_changed_draft_is_copied_again(draft: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert run(["build", *build_args(draft, out)]) == 0
    capsys.readouterr()

    def checkpoint_status() -> str:
        assert run(["plan", *build_args(draft, out), "--json"]) == 0
        return json.loads(capsys.readouterr().out)["stages"][0]["status"]

    assert checkpoint_status() == "cached"
    (draft / "generation_config.json").write_text(json.dumps({"do_sample": False}))
    assert checkpoint_status() == "will build"
