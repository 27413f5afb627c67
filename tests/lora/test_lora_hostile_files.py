"""``lora add`` of adapter directories made to hurt the loader: each is refused in one sentence and in bounded time,
never blocking on a FIFO, never reading ``/dev/zero`` or a file outside the adapter directory, never parsing an
oversized file or header; NaN, infinite or overflowing weights and broken hyperparameters are refused at load;
links that stay inside the directory (a hub-cache snapshot's) are followed. The client's own rows reach the runtime
only when finite."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.lora.adapters import make_adapter
from tests.lora.hostile import (
    CONFIG,
    WEIGHTS,
    copy_adapter,
    release_fifos,
    with_config,
    with_fifo,
    with_header_length,
    with_link,
    with_many_tensors,
    with_nan,
    with_nested_config,
    with_outside_link,
    with_padded_config,
    with_sparse_tail,
    within,
)
from trtllm_kit.artifact import Artifact
from trtllm_kit.cli import run
from trtllm_kit.errors import KitUsageError
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.runtime.lora import from_rows, to_rows
from trtllm_kit.runtime.lora_modules import module_shapes

BOUND_S = 60  # far above a refusal's time even at a load of 16; a blocked read never returns
ATTACKS: dict[str, tuple[Callable[[Path, Path], Path], str]] = {
    "config-fifo": (lambda g, d: with_fifo(g, d, CONFIG), "is a FIFO, not a regular file"),
    "config-dev-zero": (lambda g, d: with_link(g, d, CONFIG, Path("/dev/zero")), "leads to /dev/zero, outside"),
    "config-outside": (lambda g, d: with_outside_link(g, d, CONFIG), "-outside/adapter_config.json, outside"),
    "config-2mib": (lambda g, d: with_padded_config(g, d, 2 << 20), "above the bound of 1048576 bytes"),
    "config-nested": (lambda g, d: with_nested_config(g, d, 200_000), "is not JSON"),
    "weights-fifo": (lambda g, d: with_fifo(g, d, WEIGHTS), "is a FIFO, not a regular file"),
    "weights-dev-zero": (lambda g, d: with_link(g, d, WEIGHTS, Path("/dev/zero")), "leads to /dev/zero, outside"),
    "weights-outside": (lambda g, d: with_outside_link(g, d, WEIGHTS), "-outside/adapter_model.safetensors, outside"),
    "weights-header": (lambda g, d: with_header_length(g, d, 10**12), "has a header of 1000000000000 bytes"),
    "weights-60k-tensors": (lambda g, d: with_many_tensors(g, d, 60_000), "bytes, above the bound of"),
    "weights-2gib": (lambda g, d: with_sparse_tail(g, d, 2 << 30), "bytes, above the bound of"),
    "weights-nan": (lambda g, d: with_nan(g, d), "holds NaN or infinite values"),
    "weights-inf": (lambda g, d: with_nan(g, d, math.inf), "holds NaN or infinite values"),
    "scale-overflow": (lambda g, d: with_config(g, d, lora_alpha=1e300), "that are not finite in float32 once scaled"),
    "rank-zero": (lambda g, d: with_config(g, d, r=0), "has r 0; a LoRA rank is a whole number of at least 1"),
    "alpha-text": (lambda g, d: with_config(g, d, lora_alpha="x"), "has lora_alpha 'x'; it must be a finite number"),
}


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("hostile") / "out"
    assert run(["build", "builtin:tiny-llama", "--target", "cpu", "--dtype", "float32", "--no-verify",
                "--max-lora-rank", "16", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_adapter(builtin_dir("tiny-llama"), tmp_path_factory.mktemp("good") / "r4", rank=4,
                        targets=["q_proj", "v_proj", "down_proj"], alpha=8, seed=1)


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_hostile_adapter_is_refused_in_one_sentence_without_blocking(
        artifact: Path, good: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], attack: str) -> None:
    make, words = ATTACKS[attack]
    source = make(good, tmp_path / attack)
    capsys.readouterr()
    try:
        code = within(BOUND_S, lambda: run(["lora", "add", str(artifact), attack, str(source)]))
    finally:
        release_fifos(tmp_path)  # a loader that blocked on one returns
    err = capsys.readouterr().err
    assert code == 2 and words in err and err.count("\n") == 1, err
    assert attack not in Artifact.read(artifact).records.adapters
    assert not (artifact / "lora" / attack).exists()


def test_links_are_followed_only_inside_the_adapter_directory(artifact: Path, good: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A hub-cache snapshot links each file into its model folder's ``blobs/``, a linked adapter directory is its
    target: both are read; a snapshot whose link leaves the model folder is refused."""
    for repo, blobs in (("models--org--inside", None), ("models--org--escapes", tmp_path / "elsewhere")):
        snapshot = tmp_path / "hub" / repo / "snapshots" / "0123abc"
        blobs = blobs or snapshot.parent.parent / "blobs"
        copy_adapter(good, blobs)
        snapshot.mkdir(parents=True)
        for name in (CONFIG, WEIGHTS):
            (snapshot / name).symlink_to(os.path.relpath(blobs / name, snapshot))
    (tmp_path / "linked").symlink_to(good)
    capsys.readouterr()
    assert run(["lora", "add", str(artifact), "escapes", str(tmp_path / "hub" / "models--org--escapes" /
                                                             "snapshots" / "0123abc")]) == 2
    assert "elsewhere/adapter_config.json, outside" in capsys.readouterr().err
    assert run(["lora", "add", str(artifact), "inside", str(tmp_path / "hub" / "models--org--inside" / "snapshots" /
                                                            "0123abc")]) == 0
    assert run(["lora", "add", str(artifact), "linked", str(tmp_path / "linked")]) == 0
    assert {"inside", "linked"} <= set(Artifact.read(artifact).records.adapters)


def test_rows_a_client_sends_are_refused_when_not_finite(artifact: Path) -> None:
    """``lora_weights`` sent straight to ``tensorrt_llm``: NaN, or float32 values past float16's range."""
    base = json.loads((artifact / "checkpoint" / "config.json").read_text())
    fan_in, fan_out = module_shapes(base)["q_proj"]
    pairs = {(0, "q_proj"): (torch.ones(4, fan_in), torch.ones(fan_out, 4))}
    weights, keys = to_rows(pairs)
    assert set(from_rows(weights, keys, base, torch.float32)) == {(0, "q_proj")}
    for bad, dtype in ((math.nan, torch.float32), (1e6, torch.float16)):
        poisoned = weights.clone()
        poisoned[0, 5] = bad
        with pytest.raises(KitUsageError, match="lora_weights for q_proj of layer 0 holds NaN or infinite"):
            from_rows(poisoned, keys, base, dtype)
