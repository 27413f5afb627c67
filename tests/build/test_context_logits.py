"""``[build] context_logits``: the engine's trtllm-build argv ends with ``--gather_context_logits``, the plan
counts the float32 buffer of ``max_num_tokens x vocab`` per rank and ``plan`` prints it, and the artifact records
it (spec, command, ``EngineRecord.context_logits``)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from fakes import FakeTrtllmBuild

from trtllm_kit.artifact.machine import Machine
from trtllm_kit.artifact.records import EngineRecord
from trtllm_kit.build_limits import Limits
from trtllm_kit.cli import run
from trtllm_kit.gpus import GIB, gpu_from_table
from trtllm_kit.mapping import Mapping
from trtllm_kit.models.hf_config import read_hf_config
from trtllm_kit.models.registry import family_for
from trtllm_kit.plan import make_plan
from trtllm_kit.precision import Precision

CONFIGS = Path(__file__).parents[1] / "data" / "hf-configs"
LLAMA_8B = "meta-llama--Llama-3.1-8B"
LIMITS = Limits(max_batch_size=64, max_seq_len=8192, max_num_tokens=8192, tokens_per_block=32, kv_cache_fraction=0.9)


@pytest.mark.parametrize("tp", [1, 2])
def test_plan_counts_the_context_logits_buffer(tp: int) -> None:
    hf = read_hf_config(CONFIGS / LLAMA_8B)
    family = family_for(hf, LLAMA_8B)
    plain, gathered = (make_plan(hf, family, Mapping(tp, 1), Precision("float16"), gpu_from_table("H100-80GB"),
                                 replace(LIMITS, context_logits=on)) for on in (False, True))
    assert gathered.context_logits and not plain.context_logits
    for without, with_logits in zip(plain.ranks, gathered.ranks, strict=True):
        assert without.context_logits_bytes == 0
        assert with_logits.context_logits_bytes == 8192 * 128256 * 4  # ≈ 3.9 GiB: max_num_tokens x vocab x fp32
        assert without.free_bytes - with_logits.free_bytes == with_logits.context_logits_bytes
        assert with_logits.kv_pool_bytes < without.kv_pool_bytes


def test_plan_prints_the_cost(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["plan", str(CONFIGS / LLAMA_8B), "--gpu", "H100-80GB", "--max-num-tokens", "8192",
                "--context-logits"]) == 0
    expected = 8192 * 128256 * 4 / GIB
    assert f"Context logits (--gather_context_logits, [build] context_logits): {expected:.2f} GiB per rank" in \
        capsys.readouterr().out


@pytest.mark.parametrize("context_logits", [True, False])
def test_build_passes_the_switch_and_records_it(tmp_path: Path, fake_trtllm_build: FakeTrtllmBuild,
                                                gpu_host: Machine, context_logits: bool) -> None:
    out = tmp_path / "out"
    flags = ["--context-logits"] if context_logits else []
    assert run(["build", "builtin:tiny-llama", "--until", "engine", "--no-verify", "--max-batch-size", "8",
                "--max-seq-len", "128", *flags, "--out", str(out)]) == 0
    [call] = fake_trtllm_build.calls
    assert ("--gather_context_logits" in call["argv"]) is context_logits
    if context_logits:
        assert call["argv"][-1] == "--gather_context_logits"
    manifest = json.loads((out / "manifest.json").read_text())
    record = EngineRecord.from_dict(manifest["summary"]["engine"])
    assert record.context_logits is context_logits
    assert manifest["spec"]["build"]["context_logits"] is context_logits
    assert manifest["summary"]["engine"]["plan"]["context_logits"] is context_logits
