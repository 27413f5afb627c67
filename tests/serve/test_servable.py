"""A build output is served only with the trtllm-kit that wrote its Python slot model."""

from __future__ import annotations

from pathlib import Path

import pytest
from kit_server import TINY_BUILDS, Builds

from trtllm_kit.errors import KitUsageError
from trtllm_kit.serve.servable import servable


@pytest.mark.parametrize("target", ["cpu", "llmapi"])
def test_a_slot_model_from_another_kit_is_refused_with_the_rebuild(kit_builds: Builds, tmp_path: Path,
                                                                     target: str) -> None:
    out = kit_builds.copy(TINY_BUILDS[target], tmp_path / "out")
    assert servable(out).target.name == target  # this kit's own build serves
    model = out / "repo" / "tensorrt_llm" / "1" / "model.py"
    model.write_text(model.read_text().replace("trtllm_kit.", "trtllm_kit_of_another_version.", 1))
    with pytest.raises(KitUsageError, match=r"cannot be served here: its tensorrt_llm model \(.*model\.py\) was "
                                            r"written by another trtllm-kit than this one and may not run with it; "
                                            r"rebuild it on this machine \(trtllm-kit build \.\.\. --out .* --force\)"):
        servable(out)
