"""``build --target llmapi --speculative``: ``speculative_config`` in the manifest's spec, in Triton's llmapi
``model.yaml`` and in trtllm-serve's options file, in TensorRT-LLM 1.2.x's field names."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from trtllm_kit.cli import run
from trtllm_kit.models.builtin import builtin_dir


def test_draft_target_is_in_model_yaml_and_the_serve_options(tmp_path: Path) -> None:
    draft = builtin_dir("tiny-qwen2")
    out = tmp_path / "out"
    assert run(["build", "builtin:tiny-llama", "--out", str(out), "--target", "llmapi", "--no-verify",
                "--speculative", "draft-target", "--draft-model", str(draft), "--max-draft-len", "3"]) == 0
    expected = {"decoding_type": "DraftTarget", "max_draft_len": 3,
                "speculative_model_dir": str(out.absolute() / "draft")}  # the artifact's copy of the draft
    for path in (out / "repo" / "tensorrt_llm" / "1" / "model.yaml", out / "trtllm-serve" /
                 "extra_llm_api_options.yaml"):
        values = yaml.safe_load(path.read_text())
        assert values["speculative_config"] == expected, path
        assert values["disable_overlap_scheduler"] is True, path
    spec = json.loads((out / "manifest.json").read_text())["spec"]["speculative"]
    assert spec["mode"] == "draft-target" and spec["draft_model"] == str(draft) and spec["max_draft_len"] == 3
