"""Artifacts to deploy: manifests in the build's format (an engine build cannot run here, so its manifest is
written as ``trtllm-kit build`` writes it on a GPU machine, with its plan)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest


def write_artifact(out: Path, *, target: str = "engine", tp: int = 8, pp: int = 1,
                   rank_bytes: int = 17 * 10**9) -> Path:
    """A build output's manifest (and its small files) for ``target`` at tp x pp.

    Arguments:
        out: the directory; target: engine or cpu; tp, pp: the layout; rank_bytes: weight bytes per rank.
    """
    (out / "repo" / "tensorrt_llm").mkdir(parents=True)
    config = out / "repo" / "tensorrt_llm" / "config.pbtxt"
    config.write_text('name: "tensorrt_llm"\n')
    model_dir = "engines" if target == "engine" else "checkpoint"
    outputs = {f"{model_dir}/rank{r}.{'engine' if target == 'engine' else 'safetensors'}": f"{r:064x}"
               for r in range(tp * pp)}
    outputs["repo/tensorrt_llm/config.pbtxt"] = "f" * 64
    plan = {"max_batch_size": 64, "ranks": [{"rank": r, "weight_bytes": rank_bytes} for r in range(tp * pp)]}
    engine = ({"dir": "engines", "target": "engine", "world_size": tp * pp, "tp_size": tp, "pp_size": pp,
               "plan": plan} if target == "engine" else {"target": "cpu", "plan": None})
    manifest = {"schema_version": 1, "spec": {"out": str(out)}, "outputs": outputs, "summary": {
        "model": {"source": "meta-llama/Llama-3.1-70B-Instruct"}, "engine": engine,
        "checkpoint": {"tp_size": tp, "pp_size": pp, "world_size": tp * pp},
        "repo": {"target": target, "gpt_model_path": f"/models/llama70b/{model_dir}",
                 "limits": {"max_batch_size": 64}}}}
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


@pytest.fixture
def artifact(tmp_path: Path) -> Callable[..., Path]:
    """``write_artifact`` into a fresh directory."""
    counter = iter(range(100))
    return lambda **kwargs: write_artifact(tmp_path / f"artifact{next(counter)}", **kwargs)
