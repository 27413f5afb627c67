"""Items 12 and 13: quality gates that measure what means something for the model at hand, validate that finds a
broken tokenizer, and verify that finds the source model in the manifest."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from reliability_helpers import MODEL, error_line, kit
from safetensors.torch import load_file, save_file

from trtllm_kit.checkpoint.verify import perplexity_is_meaningful

CALIB = ["--calib-samples", "8", "--calib-seq-len", "64"]


def test_perplexity_is_gated_only_for_a_model_better_than_uniform() -> None:
    assert perplexity_is_meaningful(12.0, 32000)
    assert not perplexity_is_meaningful(1.25e7, 640)  # worse than a uniform guess over 640 tokens
    assert not perplexity_is_meaningful(640 / math.e * 1.01, 640)
    assert not perplexity_is_meaningful(math.nan, 640)


@pytest.mark.slow
def test_fp8_of_a_random_model_is_judged_on_kl_and_top1_and_a_broken_scale_fails(tmp_path: Path) -> None:
    out = tmp_path / "fp8"
    done = kit("build", MODEL, "--quant", "fp8", *CALIB, "--until", "checkpoint", "--out", str(out), timeout=300)
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stderr.split())
    assert ("not gated: the unquantized model scores worse than uniform/e over its 1031 tokens on this text, so "
            "its perplexity says nothing") in said
    assert "top-1 agreement" in said and "(bound 25%)" in said

    rank = out / "checkpoint" / "rank0.safetensors"
    tensors = load_file(rank)
    for name in [n for n in tensors if n.endswith("mlp.proj.weights_scaling_factor")]:
        tensors[name] = tensors[name] * 2  # the README's broken scale
    save_file(tensors, str(rank))
    done = kit("verify", str(out), timeout=300)  # no --against: the manifest names the source
    assert done.returncode == 1
    message = error_line(done)
    assert message.startswith("the quantized checkpoint strays too far from the unquantized model: FP8/None: "
                              "perplexity "), message
    assert ("calibrate on more or other data (--calib-data, --calib-samples), choose another --quant, or build with "
            "--no-verify to ship it as measured.") in message


def test_verify_without_against_and_without_a_manifest_says_what_to_pass(tiny_artifact: Path, tmp_path: Path) -> None:
    import shutil

    shutil.copytree(tiny_artifact / "checkpoint", tmp_path / "checkpoint")
    done = kit("verify", str(tmp_path / "checkpoint"))
    assert done.returncode == 2
    assert error_line(done) == (f"{tmp_path / 'checkpoint'} has no manifest.json beside it, so its source model is "
                                "unknown; pass --against with the HF model it was converted from.")


def test_validate_finds_a_missing_or_unreadable_tokenizer(artifact_copy: Path) -> None:
    assert kit("validate", str(artifact_copy)).returncode == 0
    (artifact_copy / "repo" / "preprocessing" / "tokenizer" / "tokenizer.json").write_text('{"version": "1.0", ')
    (artifact_copy / "repo" / "postprocessing" / "tokenizer" / "tokenizer.json").unlink()
    done = kit("validate", str(artifact_copy), "--json")
    assert done.returncode == 1
    findings = " ".join(done.stdout.split())
    assert "tokenizer_dir 'tokenizer': its tokenizer.json cannot be read (" in findings
    assert ("tokenizer_dir 'tokenizer': it has no tokenizer.json and transformers cannot load the files it has ("
            in findings)
    assert error_line(done) == (f"2 error(s) in {artifact_copy / 'repo'}; Triton would refuse or misserve it: fix "
                                "them (or rebuild) and validate again.")
