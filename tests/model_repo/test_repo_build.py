"""The repo stage inside ``trtllm-kit build`` (cached, atomic, in the manifest), its flags and [repo] table,
and the ``trtllm-kit validate`` command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtllm_kit.build.pipeline import run_build
from trtllm_kit.cli import run
from trtllm_kit.errors import KitUsageError
from trtllm_kit.model_repo.configs import parse_config
from trtllm_kit.names import MODEL_NAMES
from trtllm_kit.spec import BuildOptions, BuildSpec, build_spec, load_toml
from trtllm_kit.spec.repo_options import RepoOptions


def config(out: Path, model: str):
    return parse_config((out / "repo" / model / "config.pbtxt").read_text())


def qwen2_spec(out: Path, bls_instances: int) -> BuildSpec:
    return BuildSpec("builtin:tiny-qwen2", out, BuildOptions(verify=False),
                     repo=RepoOptions(bls_instances=bls_instances))


def test_build_ends_with_a_cached_repository_stage(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run_build(qwen2_spec(out, 2))
    manifest = json.loads(result.manifest_path.read_text())
    assert manifest["summary"]["stages"] == ["checkpoint", "engine", "repo"]
    repo = manifest["summary"]["repo"]
    assert (repo["target"], repo["gpt_model_path"]) == ("cpu", str(out.absolute() / "checkpoint"))
    assert sorted(p.name for p in (out / "repo").iterdir()) == sorted(MODEL_NAMES)
    assert {"repo/tensorrt_llm/1/model.py", "repo/preprocessing/tokenizer/tokenizer.json",
            "repo/postprocessing/1/text_codec.py", "repo/ensemble/config.pbtxt"} <= set(manifest["outputs"])
    trt = config(out, "tensorrt_llm")
    assert trt.backend == "python"
    assert trt.parameters["gpt_model_path"].string_value == str(out.absolute() / "checkpoint")
    assert config(out, "tensorrt_llm_bls").instance_group[0].count == 2
    assert (out / "repo" / "tensorrt_llm" / "1" / "model.py").read_bytes() == (
        Path(__file__).parents[2] / "trtllm_kit" / "triton_models" / "tensorrt_llm_cpu.py").read_bytes()
    info = out.absolute() / "repo" / "tensorrt_llm" / "xgrammar_tokenizer_info.json"  # guided decoding
    assert trt.parameters["guided_decoding_backend"].string_value == "xgrammar"
    assert trt.parameters["xgrammar_tokenizer_info_path"].string_value == str(info)
    assert set(json.loads(info.read_text())) == {"encoded_vocab", "tokenizer_str", "stop_token_ids"}

    again = run_build(qwen2_spec(out, 2))
    assert again.summary["reused"] == ["checkpoint", "engine", "repo"]
    changed = run_build(qwen2_spec(out, 3))
    assert changed.summary["reused"] == ["checkpoint", "engine"]
    assert config(out, "tensorrt_llm_bls").instance_group[0].count == 3


def test_repo_table_and_flags_reach_the_configs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    toml = tmp_path / "kit.toml"
    toml.write_text('model = "builtin:tiny-llama"\n[build]\nverify = false\n'
                    '[repo]\nmax_queue_delay_microseconds = 100\nbatch_scheduler_policy = "max_utilization"\n')
    out = tmp_path / "out"
    code = run(["build", "--config", str(toml), "--out", str(out), "--no-streaming", "--instances", "2",
                "--max-queue-size", "3", "--no-kv-cache-reuse", "--json"])
    assert code == 0, capsys.readouterr()
    trt, bls = config(out, "tensorrt_llm"), config(out, "tensorrt_llm_bls")
    assert not trt.model_transaction_policy.decoupled and not bls.model_transaction_policy.decoupled
    assert trt.parameters["enable_kv_cache_reuse"].string_value == "false"
    assert trt.parameters["enable_chunked_context"].string_value == "true"
    assert trt.parameters["batch_scheduler_policy"].string_value == "max_utilization"
    assert (trt.dynamic_batching.max_queue_delay_microseconds, trt.dynamic_batching.default_queue_policy.max_queue_size
            ) == (100, 3)
    assert [config(out, m).instance_group[0].count for m in ("preprocessing", "postprocessing")] == [2, 2]


def test_bad_repo_values_are_usage_errors(tmp_path: Path) -> None:
    toml = tmp_path / "kit.toml"
    toml.write_text('[repo]\nbls_instances = 0\n')
    with pytest.raises(KitUsageError, match=r"^bls_instances must be a positive integer, got 0.$"):
        build_spec(load_toml(toml), {"model": "builtin:tiny-llama", "out": tmp_path / "o"})
    toml.write_text('[repo]\nstreaming = true\n')
    with pytest.raises(KitUsageError, match=r"unknown key streaming in \[repo\]; did you mean \[repo\] decoupled "
                       r"\(the key of --streaming\)\?$"):
        load_toml(toml)


def test_validate_command(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    assert run(["build", "builtin:tiny-llama", "--out", str(out), "--no-verify", "--instances", "1"]) == 0
    capsys.readouterr()
    assert run(["validate", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "0 error(s)" in printed and "warning(s)" in printed and printed.count("instances") == 3
    path = out / "repo" / "tensorrt_llm" / "config.pbtxt"
    path.write_text(path.read_text().replace("max_batch_size: 8", "max_batch_size: ${triton_max_batch_size}"))
    assert run(["validate", str(out / "repo"), "--json"]) == 1
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["ok"] is False and [f["rule"] for f in report["findings"]][:2] == ["placeholder", "parse"]
    assert captured.err.strip() == (f"Error: 2 error(s) in {out / 'repo'}; Triton would refuse or misserve it: fix "
                                    "them (or rebuild) and validate again.")
    assert run(["validate", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.strip() == (f"Error: {tmp_path / 'missing'} is not a directory; pass a model "
                                               "repository (a build's repo/ directory).")
