"""What makes ``reload`` refuse an artifact as "not a new version": its target, model family or tokenizer files
differ from the served version's (each named), while a rebuild of the same model passes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from trtllm_kit.build.pipeline import run_build
from trtllm_kit.serve.fleet.hotswap import unlike
from trtllm_kit.serve.servable import Servable, servable
from trtllm_kit.spec import build_spec


def test_target_family_and_tokenizer_differences_are_named(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run_build(build_spec({}, {"model": "builtin:tiny-llama", "out": out, "build": {"verify": False}}))
    served = servable(out)
    assert unlike(served, servable(out)) == []
    artifact = served.artifact
    assert artifact.records.model is not None
    records = replace(artifact.records, model=replace(artifact.records.model, family="qwen2"))
    tokenizer = next(path for path in artifact.files if path.startswith("tokenizer/"))
    candidate: Servable = replace(served, artifact=replace(
        artifact, target="llmapi", records=records, files={**artifact.files, tokenizer: "0" * 64}))
    assert unlike(served, candidate) == ["its target is llmapi, the served one's cpu",
                                         "its model family is qwen2, the served one's llama",
                                         "its tokenizer files differ from the served one's"]
